"""A target against itself: the noise floor that `repeat: N` measures.

A copy of a target (`<name>.repeat-<i>`) runs the same prompts in an actor of its own, later in
the run, so comparing it with the original shows run-to-run determinism on this machine: the
share of prompts with identical greedy outputs, and the largest |dlogp| over positions where both
contexts are identical (the common prefix). When that floor is zero (bit-identical reruns, as CPU
kernels usually give) the difference to the reference is not noise of this machine; but another
CPU or card may choose other kernels, which is why verdicts use the near-tie rule
(fleet/analysis/divergence.py) rather than exact agreement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from fleet.analysis import aligned, prefix_pairs
from fleet.analysis.missing import no_nan
from fleet.analysis.parity import CAND, PROMPT, Frame, sequences

if TYPE_CHECKING:
    from fleet.analysis.from_stats import Pairs

_F64 = pl.Float64
COLUMNS = {
    "model": pl.String,
    "target": pl.String,
    "copy": pl.String,
    "n_prompts": pl.Int64,
    "seq_identical_rate": pl.Float64,
    "tokens_compared": pl.Int64,
    "max_abs_logprob_diff": pl.Float64,
    "mean_abs_logprob_diff": pl.Float64,
}


def from_prompt_stats(
    requests: Frame, stats: pl.LazyFrame, repeats: Mapping[str, str], *, pairs: Pairs | None = None
) -> pl.DataFrame:
    """`self_parity` from prompt_stats (fleet/results/prompt_stats.py): each prompt's logprobs list
    of the copy beside the original's, compared over the common prefix in numpy, so no token row
    is read or joined. The same figures; only the order of floating-point additions differs.
    `pairs`: the report's candidates, whose rows two candidates are compared by where it can."""
    parts = []
    for copy, original in sorted(repeats.items()):
        paired = _from_pairs(pairs, requests, copy, original) if pairs is not None else None
        if paired is not None:
            parts += paired
            continue
        pair = pl.col("target").is_in([original, copy])
        reqs = requests.lazy().filter(pair).select(*CAND, "output_token_ids").collect()
        if reqs["target"].n_unique() < 2:
            continue  # one side did not run (failed target): nothing to compare
        # Pairs of rows, by their numbers: the copy's requests with the original's, and each request
        # with its prompt_stats row (-1: none stored); no join or sort carries a list.
        side = stats.filter(pair).select(*CAND, "logprobs").collect()
        keys = reqs.select(*CAND).with_row_index("_c")
        stored = keys.join(side.select(*CAND).with_row_index("_s"), on=CAND, how="left", maintain_order="left")
        at = stored["_s"].cast(pl.Int64).fill_null(-1).to_numpy()
        is_copy = pl.col("target") == copy
        rows = keys.filter(is_copy).join(keys.filter(~is_copy).select(*PROMPT, _o="_c"), on=PROMPT)
        c, o = (rows[k].cast(pl.Int64).to_numpy() for k in ("_c", "_o"))
        out = aligned.compare_rows(aligned.Lists(reqs["output_token_ids"]), c, o)
        flat = aligned.Flat(side["logprobs"])
        models = rows["model"]
        for model in models.unique(maintain_order=True):
            mine = (models == model).to_numpy()
            mine_out = {k: v[mine] for k, v in out.items()}
            parts.append(_compared(model, original, copy, mine_out, flat, at[c[mine]], at[o[mine]]))
    return _concat(parts)


def _from_pairs(pairs: Pairs, requests: Frame, copy: str, original: str) -> list[pl.DataFrame] | None:
    """The rows of two candidates from the report's Pairs: their seq rows in key order hold the
    same prompts (each candidate's requests hold the reference's, Pairs.request_row), so row k of
    one is row k of the other, and their logprobs are the cand rows already read. None where the
    Pairs cannot tell (a side is the reference, or some requests are not in blocks)."""
    if pairs.request_row is None or not isinstance(requests, pl.DataFrame):
        return None
    spans = {(model, target): (first, end) for model, target, first, end in pairs.seq_bounds().iter_rows()}
    if not any(target == copy for _, target in spans) or not any(target == original for _, target in spans):
        return None  # a side is the reference, or did not run (then there is nothing to compare)
    ids = pairs.ids if pairs.ids is not None else aligned.Lists(requests["output_token_ids"])
    flat, parts = pairs.logprobs, []
    for (model, target), (first, end) in sorted(spans.items()):
        if target != copy or (model, original) not in spans:
            continue
        other, other_end = spans[model, original]
        if not pairs.seq[first:end].select(PROMPT).equals(pairs.seq[other:other_end].select(PROMPT)):
            return None
        out = aligned.compare_rows(ids, pairs.request_row[first:end], pairs.request_row[other:other_end])
        parts.append(
            _compared(model, original, copy, out, flat, pairs.cand_row[first:end], pairs.cand_row[other:other_end])
        )
    return parts


def _compared(
    model: str, original: str, copy: str, out: dict[str, np.ndarray], flat: aligned.Flat, c: np.ndarray, o: np.ndarray
) -> pl.DataFrame:
    """One (original, copy) row of a model from its prompts' outputs compared (aligned.compare_rows)
    and each prompt's logprobs list in `flat`: row c of the copy's, o of the original's (-1: none)."""
    has = (c >= 0) & (o >= 0)
    c, o = np.where(has, c, 0), np.where(has, o, 0)
    first = np.where(out["first_divergence"] < 0, np.iinfo(np.int64).max, out["first_divergence"])
    n = np.where(has, np.minimum(np.minimum(flat.n[c], flat.n[o]), first), 0) if flat.n.size else np.zeros_like(c)
    identical = out["first_divergence"] < 0
    if prefix_pairs.holds_no_null(flat):  # a chunk at a time (fleet/analysis/prefix_pairs.py)
        diff = prefix_pairs.AbsDiff()
        for copy_values, original_values in prefix_pairs.chunks(flat, c, flat, o, n):
            diff.add(copy_values, original_values)
        figures = (diff.count or None, diff.max(), diff.mean())
        return _row(model, original, copy, identical, dict(zip(_COMPARED, figures, strict=True)))
    row, position = aligned.common(n)
    copy_lp = flat.at(c[row], position, inside_lists=True).cast(_F64)
    d = pl.col("_d")
    frame = pl.DataFrame((copy_lp - flat.at(o[row], position, inside_lists=True).cast(_F64)).alias("_d")).select(
        tokens_compared=pl.len().cast(pl.Int64),
        max_abs_logprob_diff=no_nan(d, d.abs().max()),
        mean_abs_logprob_diff=no_nan(d, d.abs().mean()),
    )
    return _row(model, original, copy, identical, frame.row(0, named=True))


_COMPARED = ("tokens_compared", "max_abs_logprob_diff", "mean_abs_logprob_diff")


def _row(model: str, original: str, copy: str, identical: np.ndarray, compared: dict[str, object]) -> pl.DataFrame:
    """One (original, copy) row of a model: its prompts' exact matches and its prefix's differences
    (none compared: nulls, as the token-row path's left join gives)."""
    row = {"model": model, "target": original, "copy": copy, "n_prompts": len(identical)}
    row |= {"seq_identical_rate": float(identical.mean())} | compared
    if not compared[_COMPARED[0]]:
        row |= dict.fromkeys(_COMPARED)
    return pl.DataFrame([row], schema=COLUMNS)


def _figures(seq: pl.LazyFrame, pairs: pl.LazyFrame, original: str, copy: str) -> pl.DataFrame:
    """One (original, copy) row per model from the sequences and the (_lp, _lp_right) prefix pairs."""
    diff = pl.col("_lp") - pl.col("_lp_right")
    diffs = pairs.group_by("model").agg(
        tokens_compared=pl.len().cast(pl.Int64),
        max_abs_logprob_diff=no_nan(diff, diff.abs().max()),
        mean_abs_logprob_diff=no_nan(diff, diff.abs().mean()),
    )
    per_model = seq.group_by("model").agg(
        n_prompts=pl.len().cast(pl.Int64), seq_identical_rate=pl.col("exact_match").mean()
    )
    return (
        per_model.join(diffs, on="model", how="left")
        .with_columns(target=pl.lit(original), copy=pl.lit(copy))
        .select(*COLUMNS)
        .collect()
    )


def _concat(parts: list[pl.DataFrame]) -> pl.DataFrame:
    if not parts:
        return pl.DataFrame(schema=COLUMNS)
    return pl.concat(parts).cast(COLUMNS).sort("model", "target", "copy")  # type: ignore[arg-type]


def self_parity(requests: Frame, tokens: Frame, repeats: Mapping[str, str]) -> pl.DataFrame:
    """Per (model, target, copy): n_prompts, seq_identical_rate, and over the common prefix
    tokens_compared, max_abs_logprob_diff, mean_abs_logprob_diff (the copy's logprob vs the
    original's at the same position and context)."""
    parts = []
    for copy, original in sorted(repeats.items()):
        pair = pl.col("target").is_in([original, copy])
        reqs, toks = requests.lazy().filter(pair), tokens.lazy().filter(pair)
        if reqs.select(pl.col("target").n_unique()).collect().item() < 2:
            continue  # one side did not run (failed target): nothing to compare
        seq = sequences(reqs, original).lazy()
        side = toks.select(*CAND, "position", _lp=pl.col("logprob").cast(_F64))
        pairs = (
            side.filter(pl.col("target") == copy)
            .join(side.filter(pl.col("target") == original).drop("target"), on=[*CAND[:1], *CAND[2:], "position"])
            .join(seq.select(*CAND, "first_divergence"), on=CAND)
            .filter(pl.col("first_divergence").is_null() | (pl.col("position") < pl.col("first_divergence")))
        )
        parts.append(_figures(seq, pairs, original, copy))
    return _concat(parts)
