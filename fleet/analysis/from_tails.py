"""A candidate's |dlogp| figures from the aggregates its shards wrote (fleet/results/prompt_tails.py):
TF max, mean and p99 and the noise model (fleet/analysis/noise_model.py), merged from per-prompt
counts, sums, maxima and tails instead of computed from every position.

The figures are today's: the max is the max; the mean is the same sum, its additions in another
order; each p99 is the same interpolation of the same two order statistics, which lie in the
tails; the bootstrap interval draws the same resamples and reads each resample's p99 off the same
log bins (fleet/analysis/bootstrap.py `tail_interval`). Where that cannot hold, `figures` returns
None and the caller computes from the positions, as for a run written before the aggregates: a
candidate of at most bootstrap.EXACT_MAX_VALUES positions (its bootstrap resamples every value),
one with a NaN logprob, one the twin scored only in part, or one where an order statistic is below
a shard's floor (a shard whose |dlogp| are far above the others').
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from fleet.analysis import bootstrap
from fleet.analysis.noise_model import (
    BOOTSTRAP,
    DEFAULT_TWIN_P99,
    QUANTILE,
    NoiseSpec,
    default_source,
    twin_source,
)
from fleet.analysis.noise_model import figures as noise_figures
from fleet.results.prompt_tails import COLUMNS

__all__ = ["COLUMNS", "figures"]


def figures(
    rows: pl.DataFrame,
    prompt: np.ndarray,
    spec: NoiseSpec,
    model: str,
    target: str,
    *,
    exact_max: int | None = None,
) -> tuple[dict[str, float], dict[str, Any]] | None:
    """(tf_max/mean/p99 of |dlogp|, noise_model.one's row) of one candidate's prompt_stats `rows`
    (`prompt`: each row's rank in key order), or None where only every position gives them.
    `exact_max`: the most positions for which the positions are read (bootstrap.EXACT_MAX_VALUES)."""
    if rows["tf_positions"].null_count():  # written before the aggregates
        return None
    n = rows["tf_positions"].to_numpy().astype(np.int64)
    total = int(n.sum())
    sums = rows["tf_abs_sum"].to_numpy()
    if total <= (bootstrap.EXACT_MAX_VALUES if exact_max is None else exact_max) or not total or np.isnan(sums).any():
        return None
    twin_n = rows["twin_positions"].to_numpy().astype(np.int64)
    twinned = bool((twin_n == n).all())
    if not twinned and twin_n.any():  # the twin scored some positions: the exact path restricts to them
        return None
    # Prompts with a value, renumbered 0..P-1 in key order (noise_model.one's bootstrap units).
    present = np.zeros(len(prompt), dtype=bool)
    present[prompt] = n > 0
    code = (np.cumsum(present) - 1)[prompt]
    blocks, units = bootstrap.block_of(code[n > 0])
    block = np.zeros(len(n), dtype=np.int64)
    block[n > 0] = blocks
    cand = _tail(rows, "tf", n, block, units)
    p99 = cand.quantile(QUANTILE)
    if p99 is None:
        return None
    tf = {
        "tf_max_abs_logprob_diff": float(rows["tf_abs_max"].max()),  # type: ignore[arg-type]
        "tf_mean_abs_logprob_diff": float(sums.sum() / total),
        "tf_p99_abs_logprob_diff": p99,
    }
    dtype = spec.dtype(model, target)
    allowance = spec.allowance.get(dtype, 1.0)
    twin = _tail(rows, "twin", twin_n, block, units) if twinned else None
    twin_p99 = (
        twin.quantile(QUANTILE) if twin is not None else DEFAULT_TWIN_P99.get(dtype, DEFAULT_TWIN_P99["bfloat16"])
    )
    if twin_p99 is None:
        return None
    noise = twin_p99 * allowance
    ci = bootstrap.tail_interval(
        cand, twin, units, twin_p99=twin_p99, allowance=allowance, quantile=QUANTILE, resamples=BOOTSTRAP
    )
    if ci is None:
        return None
    source = twin_source(dtype, allowance) if twin is not None else default_source(dtype, allowance)
    row = noise_figures(twin_p99 if twin is not None else None, noise, source, p99 / noise if noise > 0 else None, ci)
    return tf, row


def _tail(rows: pl.DataFrame, side: str, n: np.ndarray, block: np.ndarray, units: int) -> bootstrap.Tail:
    """One side's tail ("tf": the candidate's |dlogp|, "twin": the twin's): every row's tail values,
    the floor above which none is missing (the highest floor of the rows that kept only a tail), and
    the count of values per block."""
    lists = rows[f"{side}_abs_tail"]
    kept = lists.list.len().fill_null(0).to_numpy().astype(np.int64)
    values = lists.explode(empty_as_null=False, keep_nulls=False).to_numpy()
    floors = rows[f"{side}_tail_floor"].fill_null(0.0).to_numpy()
    partial = kept < n
    floor = float(floors[partial].max()) if partial.any() else 0.0
    block_n = np.bincount(block, weights=n, minlength=units)
    return bootstrap.Tail(values, np.repeat(block, kept), floor, int(n.sum()), block_n)
