"""The analysis half of the worked example in CONTRIBUTING.md ("Adding a report section"): in
the product it would be a function in fleet/analysis/; the test registers it as a section
(tests/test_section_registry.py), the other half."""

from __future__ import annotations

import polars as pl


def tail_share(tokens: pl.LazyFrame, reference: str, *, nats: float = 0.1) -> pl.DataFrame:
    """Per candidate: its teacher-forced positions, and the share of them whose |logprob -
    reference logprob| exceeds `nats`."""
    gap = (pl.col("logprob") - pl.col("ref_logprob")).abs()
    return (
        tokens.filter(pl.col("target") != reference, pl.col("ref_logprob").is_not_null())
        .group_by("model", "target")
        .agg(n_positions=pl.len(), tail_share=(gap > nats).mean())
        .sort("model", "target")
        .collect()
    )
