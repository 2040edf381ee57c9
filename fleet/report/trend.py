"""`fleet runs ROOT --trend METRIC`: a perf figure across a results root's runs (fleet/analysis/trend.py),
as text (a sparkline per model, target, scenario and level, then the figures per run) and as a
self-contained HTML page with a line per series (`--html FILE`)."""

from __future__ import annotations

from html import escape
from pathlib import Path

import polars as pl

from fleet.analysis.trend import SERIES
from fleet.report import svg
from fleet.report.html import CSP, CSS
from fleet.report.table import markdown

_BARS = "▁▂▃▄▅▆▇█"


def _labelled(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(
        series=pl.format("{} / {} {}@{}", *(pl.col(c) for c in SERIES)),
    )


def sparkline(values: list[float | None]) -> str:
    """One character per run, its height the value's place between the series' min and max; · where not measured."""
    known = [v for v in values if v is not None]
    if not known:
        return "·" * len(values)
    lo, hi = min(known), max(known)
    span = hi - lo
    top = len(_BARS) - 1
    return "".join("·" if v is None else _BARS[round((v - lo) / span * top) if span > 0 else top // 2] for v in values)


def _wide(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per run (in order), one column per series."""
    runs = frame.select("run_id", "started_at", "gates").unique("run_id", maintain_order=True)
    pivot = _labelled(frame).pivot(on="series", index="run_id", values="value", aggregate_function="first")
    return runs.join(pivot, on="run_id", how="left", maintain_order="left")


def render_text(frame: pl.DataFrame, metric: str, *, results_root: str | Path) -> str:
    if frame.is_empty():
        return f"{metric}: no run under {results_root} measured a perf level"
    wide = _wide(frame)
    series = wide.columns[3:]
    out = [f"{metric} across {wide.height} runs of {results_root} (oldest first; · = not measured in that run)", ""]
    width = max(len(s) for s in series)
    for name in series:
        values = wide[name].to_list()
        known = [v for v in values if v is not None]
        last = f"last {known[-1]:.4g}" if known else ""
        change = f" ({known[-1] / known[-2] - 1:+.1%} vs the run before)" if len(known) > 1 and known[-2] else ""
        out.append(
            f"  {name:<{width}}  {sparkline(values)}  min {min(known):.4g}  max {max(known):.4g}  {last}{change}"
        )
    return "\n".join([*out, "", markdown(wide, {c: c for c in wide.columns})])


def render_html(frame: pl.DataFrame, metric: str, *, results_root: str | Path) -> str:
    """A page with one line per series over the runs (x: the run's place, oldest first) and the table."""
    title = f"{metric} across the runs of {results_root}"
    if frame.is_empty():
        plot, table = svg.placeholder(title, "no perf level measured"), ""
    else:
        wide = _wide(frame)
        x = list(range(1, wide.height + 1))
        lines = {
            name: (x, [float("nan") if v is None else v for v in wide[name].to_list()]) for name in wide.columns[3:]
        }
        plot = svg.lines(lines, title=title, x_label="run, oldest first (ids in the table)", y_label=metric)
        numbered = wide.with_columns(pl.int_range(1, wide.height + 1).alias("#")).select("#", *wide.columns)
        head = "".join(f"<th>{escape(c)}</th>" for c in numbered.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{escape(_cell(v))}</td>" for v in row) + "</tr>" for row in numbered.iter_rows()
        )
        table = f"<table><tr>{head}</tr>{body}</table>"
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" '
        f'content="{CSP}"><title>{escape(title)}</title><style>{CSS}</style></head><body>'
        f'<h1>{escape(title)}</h1><div class="plots">{plot}</div>{table}</body></html>'
    )


def _cell(value: object) -> str:
    if value is None:
        return "·"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
