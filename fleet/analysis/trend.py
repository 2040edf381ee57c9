"""A perf figure across the runs of a results root, per model, target, scenario and level: what
`fleet runs ROOT --trend METRIC` draws (fleet/report/trend.py renders it).

It reads the root as one data set (fleet/results/catalog.py): the runs from the catalog, the perf
tables of every run stacked and scanned for the columns the figure needs; no run.json is opened.
Every figure is computed as one run's report computes it (fleet/analysis/perf.py), per run.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from fleet.analysis.perf import first_runs
from fleet.analysis.perf import summary as perf_summary
from fleet.contracts.errors import UserError
from fleet.contracts.gates import METRICS
from fleet.contracts.messages import unknown
from fleet.results import catalog

SERIES = ["model", "target", "scenario", "level"]
COLUMNS = ["run_id", "started_at", "gates", *SERIES, "value"]
# Goodput depends on each run's own SLO: across runs it may measure different things.
_PER_RUN_SLO = ("perf_goodput_qps", "perf_goodput_tok_s", "perf_slo_share")
TRENDED = [m for m in METRICS if m.startswith("perf_") and m not in _PER_RUN_SLO]


def check_metric(metric: str) -> str:
    """`metric` if a trend can draw it, else a UserError saying which ids it takes."""
    if metric in TRENDED:
        return metric
    if metric in METRICS:
        why = "depends on each run's SLO" if metric in _PER_RUN_SLO else "is a figure of one run's parity analysis"
        msg = f"--trend {metric}: {why}; --trend draws perf figures (perf_output_tok_s, perf_ttft_p99_s, ...)"
        raise UserError(msg)
    raise UserError(unknown("perf figure", metric, TRENDED, listed='docs/metrics.md "Gate metric ids" (perf_*)'))


def trend(results_root: str | Path, metric: str) -> pl.DataFrame:
    """One row per run x model x target x scenario x level that measured the figure: COLUMNS, runs
    in the order they started (the catalog's order)."""
    column = check_metric(metric).removeprefix("perf_")
    tables = catalog.stacked(results_root)
    runs = tables["runs"].select("run_id", "started_at", "gates").collect()
    levels = first_runs(tables["perf_levels"])
    if levels.is_empty():
        return pl.DataFrame(schema={**dict.fromkeys(COLUMNS, pl.String), "level": pl.Int64, "value": pl.Float64})
    figures = perf_summary(first_runs(tables["perf_requests"]), levels, by=["run_id"])
    order = {run: i for i, run in enumerate(runs["run_id"])}
    return (
        figures.select("run_id", *SERIES, value=pl.col(column).cast(pl.Float64))
        .join(runs, on="run_id", how="left")
        .with_columns(_order=pl.col("run_id").replace_strict(order, default=len(order), return_dtype=pl.Int64))
        .sort("_order", *SERIES)
        .select(COLUMNS)
    )
