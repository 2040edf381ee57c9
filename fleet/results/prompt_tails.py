"""A shard's partial aggregates of |dlogp|, written in its prompt_stats rows so the report merges
them instead of reading every position (fleet/analysis/from_tails.py merges them).

Per prompt: how many positions were scored, the sum and the largest |candidate - reference| there,
how many of them the precision twin scored, and the tail: every value at or above the shard's floor,
the value TAIL_SHARE of the shard's positions reach (ties at the floor kept), in position order;
the same for |twin - reference|. The report's p99s and its bootstrap read only the upper end of
these distributions, and every value of that end is in some prompt's tail as long as no shard's
floor is above it: the report checks that (a shard whose floor is above the order statistic it
needs sends that candidate back to the per-position lists), so a figure from tails is the figure
from every position, not an estimate. A shard of at most TAIL_ALL positions keeps them all.

The values are the ones the report computed itself before: float32 logprobs subtracted in float64.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

TAIL_SHARE = 0.1
TAIL_ALL = 64


def of_rows(tokens: pa.Table, starts: np.ndarray) -> dict[str, pa.Array]:
    """The aggregate columns (COLUMNS) of each prompt's run of grouped token rows, the runs
    starting at `starts`."""
    ref = _numbers(tokens, "ref_logprob")
    cand = np.subtract(_numbers(tokens, "logprob"), ref, dtype=np.float64)
    twin = np.subtract(_numbers(tokens, "twin_logprob"), ref, dtype=np.float64)
    np.abs(cand, out=cand)
    np.abs(twin, out=twin)
    # Scored: both logprobs present (a NaN logprob counts, as the report counts it); twinned: of
    # those, where the twin's value is a number.
    scored = tokens.column("ref_logprob").is_valid().to_numpy(zero_copy_only=False)
    scored &= tokens.column("logprob").is_valid().to_numpy(zero_copy_only=False)
    twinned = scored & ~np.isnan(twin)
    columns = {
        "tf_positions": _per_run(np.add, scored.astype(np.int32), starts),
        "twin_positions": _per_run(np.add, twinned.astype(np.int32), starts),
        # Polars' own sum of each prompt's values, as kl_sum (and a group-by's sum) adds them.
        "tf_abs_sum": _list_sums(np.where(scored, cand, 0.0), starts),
    }
    largest = _per_run(np.maximum, np.where(scored, cand, -np.inf), starts)
    columns["tf_abs_max"] = pa.array(largest, mask=np.isneginf(largest))
    for prefix, values, present in (("tf", cand, scored & ~np.isnan(cand)), ("twin", twin, twinned)):
        floor = _floor(values[present])
        kept = present & (values >= floor) if floor is not None else np.zeros(len(values), bool)
        ends = np.cumsum(np.add.reduceat(kept.astype(np.int64), starts)) if len(starts) else np.zeros(0, np.int64)
        tail_offsets = pa.array(np.concatenate([[0], ends]).astype(np.int32))
        columns[f"{prefix}_tail_floor"] = (
            pa.nulls(len(starts), pa.float64()) if floor is None else pa.array(np.full(len(starts), floor))
        )
        columns[f"{prefix}_abs_tail"] = pa.ListArray.from_arrays(tail_offsets, pa.array(values[kept]))
    return columns


COLUMNS = ["tf_positions", "twin_positions", "tf_abs_sum", "tf_abs_max", "tf_tail_floor", "tf_abs_tail"]
COLUMNS += ["twin_tail_floor", "twin_abs_tail"]


def _numbers(tokens: pa.Table, name: str) -> np.ndarray:
    """A float32 column as numbers, NaN for nulls."""
    column = tokens.column(name).combine_chunks()
    return np.asarray(column.fill_null(float("nan")).to_numpy(zero_copy_only=False), dtype=np.float32)


def _per_run(ufunc: np.ufunc, values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return ufunc.reduceat(values, starts) if len(starts) else values[:0]


def _list_sums(values: np.ndarray, starts: np.ndarray) -> pa.Array:
    offsets = pa.array(np.append(starts, len(values)).astype(np.int32))
    sums = pl.from_arrow(pa.ListArray.from_arrays(offsets, pa.array(values))).list.sum()  # type: ignore[union-attr]
    return sums.to_arrow()


def _floor(values: np.ndarray) -> float | None:
    """The value the top TAIL_SHARE of `values` reach (0: keep them all; None: there are none)."""
    n = len(values)
    if not n:
        return None
    if n <= TAIL_ALL:
        return 0.0
    keep = int(np.ceil(n * TAIL_SHARE))
    return float(np.partition(values, n - keep)[n - keep])
