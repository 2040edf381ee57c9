"""Whether a target passed: what `after:` waits on during a run, and what 003's stage table says.

"Passed" means it ran, nothing of it failed, and every gate that checks it passed; a target that
merely started has not passed.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from fleet.analysis import gates as gate_mod
from fleet.contracts.errors import UserError
from fleet.report.model import RunReport


def gates_failed(run_dir: str | Path, model: str, target: str) -> str | None:
    """Why `target` of `model` fails its gates on the rows written so far; None when every gate
    that checks it passes (or none does). What `after:` waits on during a run."""
    try:
        verdicts = RunReport.build(run_dir, top=1).verdicts
    except UserError as e:  # e.g. the reference wrote nothing: nothing of the target can be verified
        return f"gates not evaluated: {e}"
    if verdicts is None:
        return None
    failing = verdicts.filter((pl.col("model") == model) & (pl.col("target") == target) & (pl.col("verdict") == "FAIL"))
    return "gates failed: " + "; ".join(failing["gate"]) if failing.height else None


def stage_result(report: RunReport, model: str, target: str) -> str:
    """How a target ended: its failure, its failed shards, "gates failed", "not run", or "passed"
    (it ran, nothing of it failed and every gate that checks it passed)."""
    key, info = f"{model}/{target}", report.info
    if key in info.failures:
        return info.failures[key]
    if shards := sorted(s for s in info.failed_shards if s.startswith(f"{key}/")):
        return f"failed: {', '.join(shards)}"
    if key not in info.provenance:
        return "not run"
    mine = (
        report.verdicts.filter((pl.col("model") == model) & (pl.col("target") == target))
        if report.verdicts is not None
        else None
    )
    if mine is not None and not gate_mod.passed(mine):
        return "gates failed: " + "; ".join(mine.filter(pl.col("verdict") == "FAIL")["gate"])
    return "passed"
