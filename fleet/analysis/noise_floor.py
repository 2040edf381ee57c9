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

import polars as pl

from fleet.analysis.missing import no_nan
from fleet.analysis.parity import CAND, Frame, sequences

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


def self_parity(requests: Frame, tokens: Frame, repeats: Mapping[str, str]) -> pl.DataFrame:
    """Per (model, target, copy): n_prompts, seq_identical_rate, and over the common prefix
    tokens_compared, max_abs_logprob_diff, mean_abs_logprob_diff (the copy's logprob vs the
    original's at the same position and context)."""
    parts = []
    diff = pl.col("_lp") - pl.col("_lp_right")
    for copy, original in sorted(repeats.items()):
        pair = pl.col("target").is_in([original, copy])
        reqs, toks = requests.lazy().filter(pair), tokens.lazy().filter(pair)
        if reqs.select(pl.col("target").n_unique()).collect().item() < 2:
            continue  # one side did not run (failed target): nothing to compare
        seq = sequences(reqs, original).lazy()
        side = toks.select(*CAND, "position", _lp=pl.col("logprob").cast(_F64))
        diffs = (
            side.filter(pl.col("target") == copy)
            .join(side.filter(pl.col("target") == original).drop("target"), on=[*CAND[:1], *CAND[2:], "position"])
            .join(seq.select(*CAND, "first_divergence"), on=CAND)
            .filter(pl.col("first_divergence").is_null() | (pl.col("position") < pl.col("first_divergence")))
            .group_by("model")
            .agg(
                tokens_compared=pl.len().cast(pl.Int64),
                max_abs_logprob_diff=no_nan(diff, diff.abs().max()),
                mean_abs_logprob_diff=no_nan(diff, diff.abs().mean()),
            )
        )
        per_model = seq.group_by("model").agg(
            n_prompts=pl.len().cast(pl.Int64), seq_identical_rate=pl.col("exact_match").mean()
        )
        parts.append(
            per_model.join(diffs, on="model", how="left")
            .with_columns(target=pl.lit(original), copy=pl.lit(copy))
            .select(*COLUMNS)
            .collect()
        )
    if not parts:
        return pl.DataFrame(schema=COLUMNS)
    return pl.concat(parts).cast(COLUMNS).sort("model", "target", "copy")  # type: ignore[arg-type]
