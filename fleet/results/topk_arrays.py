"""The tie-aware top-1 agreement and KL top-k of each token row, in numpy over padded top-k arrays.

fleet/results/prompt_stats.py defines both as Polars expressions (`top1_agreement`, `kl`), which
the exact path and tests use; over a whole shard they are ~60 column expressions, most of a
shard's summarising cost. Here the same comparisons and the same float64 operations, in the same
order, run on [rows, k] arrays; exp and log are Polars' own (so their last bits are the same),
everything else is +, -, *, / and comparisons, which IEEE 754 fixes. `rows` answers only for the
rows the arrays can say exactly: every logprob finite and <= 0 (no NaN, no overflow, no
NaN-ordering question), no null inside a top-k list, ids and logprobs lists of equal lengths.
Any other shard (a NaN from a broken engine, say) takes the Polars expressions.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from fleet.results.prompt_stats import TAIL_FLOOR


class Padded:
    """A list column as [k, rows] values and a [k, rows] mask of the slots that hold one: slot-major,
    each slot's values one contiguous vector (numpy reduces over a short inner axis slowly)."""

    def __init__(self, column: pa.ChunkedArray, k: int) -> None:
        lists = column.combine_chunks()
        n = len(lists)
        self.lengths = np.asarray(lists.value_lengths().fill_null(0), dtype=np.int64)
        self.null = np.asarray(lists.is_null())
        offsets = np.asarray(lists.offsets, dtype=np.int64)
        flat = lists.values.to_numpy(zero_copy_only=False)
        self.clean = lists.values.null_count == 0
        if n and (self.lengths == k).all() and offsets[-1] - offsets[0] == n * k:  # every list full: a reshape
            self.values = np.ascontiguousarray(flat[offsets[0] : offsets[-1]].reshape(n, k).T)
            self.valid = np.ones((k, n), bool)
            return
        self.valid = np.arange(k)[:, None] < self.lengths[None, :]
        at = np.where(self.valid, offsets[None, :-1] + np.arange(k)[:, None], 0)
        self.values = flat[at] if len(flat) else np.zeros((k, n), flat.dtype)


def per_row(tokens: pa.Table, k: int) -> dict[str, pa.Array] | None:
    """Per token row, what prompt_stats lists or sums: _tied (`top1_agreement(k)`), _kl
    (`when(both_topk()).then(kl(k))`), ref_top1_logprobs and ref_top1_ids (the reference's first
    slot), in_ref_topk (`ref_topk_ids.list.contains(token_id).fill_null(False)`), ref_top1_in_topk
    (`topk_ids.list.contains(ref_top1_ids)`); None where the arrays cannot say them exactly."""
    cand_ids, cand_lp = Padded(tokens.column("topk_ids"), k), Padded(tokens.column("topk_logprobs"), k)
    ref_ids, ref_lp = Padded(tokens.column("ref_topk_ids"), k), Padded(tokens.column("ref_topk_logprobs"), k)
    logprob, ref_logprob = _floats(tokens.column("logprob")), _floats(tokens.column("ref_logprob"))
    same_shape = np.array_equal(cand_ids.lengths, cand_lp.lengths) and np.array_equal(ref_ids.lengths, ref_lp.lengths)
    if not same_shape or not all(x.clean for x in (cand_ids, cand_lp, ref_ids, ref_lp)):
        return None
    if not all(_tame(x.values[x.valid]) for x in (cand_lp, ref_lp)):
        return None
    if not (_tame(logprob[0][logprob[1]]) and _tame(ref_logprob[0][ref_logprob[1]])):
        return None
    token = tokens.column("token_id").to_numpy()
    has_ref = ref_ids.lengths > 0
    ref_top1 = ref_ids.values[0] if k else np.zeros(len(token), np.int32)
    in_ref = np.zeros(len(token), bool)
    for j in range(k):
        in_ref |= ref_ids.valid[j] & (ref_ids.values[j] == token)
    top1_in_cand = np.zeros(len(token), bool)
    for j in range(k):
        top1_in_cand |= cand_ids.valid[j] & (cand_ids.values[j] == ref_top1) & has_ref
    if not has_ref.any():  # nothing scored: a reference's own rows
        tied, kl = pa.nulls(len(token), pa.bool_()), pa.nulls(len(token), pa.float64())
    else:
        tied = _tied(token, logprob, ref_logprob, cand_ids, cand_lp, ref_ids, ref_lp)
        kl = _kl(cand_ids, cand_lp, ref_ids, ref_lp)
    return {
        "_tied": tied,
        "_kl": kl,
        "ref_top1_logprobs": pa.array(ref_lp.values[0] if k else np.zeros(len(token), np.float32), mask=~has_ref),
        "in_ref_topk": pa.array(in_ref),
        "ref_top1_ids": pa.array(ref_top1, mask=~has_ref),
        # A null topk_ids list contains nothing, not even "no reference top-1": null.
        "ref_top1_in_topk": pa.array(top1_in_cand, mask=cand_ids.null),
    }


def _floats(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of a nullable float column."""
    array = column.combine_chunks()
    valid = np.asarray(array.is_valid())
    return array.fill_null(0.0).to_numpy(), valid


def _tame(values: np.ndarray) -> bool:
    """Finite logprobs (<= 0): no NaN to order, no exp to overflow."""
    return bool(np.isfinite(values).all() and (values <= 0).all())


def _max(values: np.ndarray, valid: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Per row, the largest of `start` and the valid slots (-inf where none)."""
    out = start
    for j in range(len(values)):
        out = np.maximum(out, np.where(valid[j], values[j], -np.inf))
    return out


def _tied(
    token: np.ndarray,
    logprob: tuple[np.ndarray, np.ndarray],
    ref_logprob: tuple[np.ndarray, np.ndarray],
    cand_ids: Padded,
    cand_lp: Padded,
    ref_ids: Padded,
    ref_lp: Padded,
) -> pa.Array:
    """`top1_agreement`: the candidate's tied maxima (its token among them) meet the reference's."""
    cand_max = _max(cand_lp.values, cand_lp.valid, np.where(logprob[1], logprob[0], -np.inf))
    ref_max = _max(ref_lp.values, ref_lp.valid, np.full(len(token), -np.inf))
    has_ref = ref_lp.lengths > 0
    cand = [(token, np.ones(len(token), bool))]
    cand += [
        (cand_ids.values[j], cand_lp.valid[j] & (cand_lp.values[j] >= cand_max)) for j in range(len(cand_lp.values))
    ]
    ref = [(token, ref_logprob[1] & has_ref & (ref_logprob[0] >= ref_max))]
    ref += [(ref_ids.values[j], ref_lp.valid[j] & (ref_lp.values[j] >= ref_max)) for j in range(len(ref_lp.values))]
    meet = np.zeros(len(token), bool)
    for c_id, in_cand in cand:
        for r_id, in_ref in ref:
            meet |= (c_id == r_id) & in_cand & in_ref
    return pa.array(meet, mask=~has_ref)  # null where the reference scored nothing


def _polars(values: np.ndarray, op: str) -> np.ndarray:
    """Polars' elementwise exp or log: the last bits the Polars expressions get."""
    return getattr(pl.Series(values.reshape(-1)), op)().to_numpy().reshape(values.shape)


def _kl(cand_ids: Padded, cand_lp: Padded, ref_ids: Padded, ref_lp: Padded) -> pa.Array:
    """`kl`, null where not `both_topk`: per reference slot its logprob against the candidate's for
    the same id (its smallest where it has none), the tails' term last."""
    both = (ref_ids.lengths > 0) & (cand_ids.lengths > 0)
    every = bool(both.all())  # a scored candidate shard: no rows to pick

    def picked(values: np.ndarray) -> np.ndarray:
        return values if every else values[:, both]

    c_ids, c_valid, c_lp = picked(cand_ids.values), picked(cand_lp.valid), picked(cand_lp.values).astype(np.float64)
    r_ids, r_valid, lr = picked(ref_ids.values), picked(ref_ids.valid), picked(ref_lp.values).astype(np.float64)
    lc_min = np.full(lr.shape[1], np.inf)
    for m in range(len(c_lp)):
        lc_min = np.minimum(lc_min, np.where(c_valid[m], c_lp[m], np.inf))
    lc = np.empty_like(lr)
    for j in range(len(lr)):
        lc[j] = lc_min
        for m in range(len(c_lp) - 1, -1, -1):  # the first candidate slot with the id wins
            hit = c_valid[m] & (c_ids[m] == r_ids[j])
            lc[j] = np.where(hit, c_lp[m], lc[j])
    exp_r, exp_c = _polars(lr, "exp"), _polars(lc, "exp")
    head, sum_pr, sum_pc = (np.zeros(lr.shape[1]) for _ in range(3))
    for j in range(len(lr)):
        present = r_valid[j]
        head = head + np.where(present, exp_r[j] * (lr[j] - lc[j]), 0.0)
        sum_pr = sum_pr + np.where(present, exp_r[j], 0.0)
        sum_pc = sum_pc + np.where(present, exp_c[j], 0.0)
    tail_r = np.maximum(1 - sum_pr, TAIL_FLOOR)
    tail_c = np.maximum(1 - sum_pc, TAIL_FLOOR)
    kl = head + tail_r * _polars(tail_r / tail_c, "log")
    if every:
        return pa.array(kl)
    out = np.zeros(len(both))
    out[both] = kl
    return pa.array(out, mask=~both)
