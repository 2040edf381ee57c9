"""The feature matrix of a run whose targets have a `matrix:` (its variants, one target per
combination of settings): per model x variant whether it started, passed its gates and how fast
it ran, and the greedy self-consistency between variants that differ in one setting, which the
matrix and setting-effects sections show.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from fleet.analysis import consistency
from fleet.analysis import gates as gate_mod
from fleet.results.info import RunInfo


def consistency_pairs(
    requests: pl.DataFrame, tokens: pl.LazyFrame, parity: pl.DataFrame, variants: dict[str, dict[str, Any]]
) -> pl.DataFrame:
    """Greedy self-consistency per prompt (consistency.prompt_pairs) between variants that differ in
    one setting, their partings judged by the parity's near-tie rule and noise model."""
    return consistency.prompt_pairs(
        requests,
        {n: v["base"] for n, v in variants.items()},
        settings={n: v["settings"] for n, v in variants.items()},
        tokens=tokens,
        noise=parity.select("model", "target", "noise") if "noise" in parity.columns else None,
    )


def matrix(
    info: RunInfo,
    requests: pl.DataFrame,
    throughput: pl.DataFrame,
    verdicts: pl.DataFrame | None,
    variants: dict[str, dict[str, Any]],
) -> pl.DataFrame:
    """The feature matrix, per model x variant: did it start, did it pass its gates, its throughput."""
    failures, provenance = info.failures, info.provenance
    rows = []
    for model in sorted({k.split("/")[0] for k in provenance} | set(requests["model"].unique())):
        for name, variant in variants.items():
            key, mine = f"{model}/{name}", (pl.col("model") == model) & (pl.col("target") == name)
            checks = verdicts.filter(mine) if verdicts is not None else None
            tok_s = throughput.filter(mine)["output_tok_s"]
            rows.append(
                {
                    "model": model,
                    "variant": name,
                    "settings": ", ".join(f"{k}={v}" for k, v in variant["settings"].items()),
                    "started": key in provenance and key not in failures,
                    "gates": "n/a"
                    if checks is None or checks.is_empty()
                    else ("PASS" if gate_mod.passed(checks) else "FAIL"),
                    "output_tok_s": tok_s[0] if tok_s.len() else None,
                    "failure": failures.get(key),
                }
            )
    schema = {"model": pl.String, "variant": pl.String, "settings": pl.String, "started": pl.Boolean}
    schema |= {"gates": pl.String, "output_tok_s": pl.Float64, "failure": pl.String}
    return pl.DataFrame(rows, schema=schema)
