"""Gates against earlier runs: a gate whose `baseline` names runs (a run id, a list of them, or
`latest-pass`, with `runs: k` the newest k) in the same results root, judged on a 95 % bootstrap
interval of measured / baseline (the mean of the baseline runs' figures).

The rule (docs/metrics.md): `measured >= ratio x baseline` fails only when the whole interval of
measured / baseline lies below `ratio` (its upper end < ratio); `<=` fails only when its lower end
lies above it. Request-to-request noise widens the interval and cannot fail a gate; a drop larger
than the margin, measured on enough requests to be sure of it, does. Against one run the interval
resamples both runs' requests at that scenario and level; against several it resamples the runs
too, so it holds their run-to-run spread (fleet/analysis/perf_resample.py, `runs_ratios`).

`latest-pass` is the newest run of the results root that started before this one, recorded a PASS
(`fleet run` writes its verdict to run.json and the root's catalog) and ran this model and target,
found from the catalog (fleet/results/catalog.py) without opening any run.json. When there is none
the gate is SKIP with a reason, not FAIL: the first run of a series has nothing to compare with,
and a FAIL would keep every later run from finding a passing one. Fewer passing runs than `runs`
asks for: the gate is judged on those and says so. A named run id missing from the root is a FAIL
naming the root and the runs it holds (`fleet run` refuses such a gate before it starts:
fleet/run/check.py).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from fleet.analysis import perf_resample
from fleet.analysis.perf import first_runs, slos
from fleet.analysis.perf import summary as perf_summary
from fleet.contracts.errors import UserError
from fleet.contracts.gates import LATEST_PASS, OPS, Gate
from fleet.results import catalog, reader, store
from fleet.results.info import RunInfo

Key = tuple[str, str, str, int]  # model, target, scenario, level


def results_root(run_dir: str | Path) -> str | Path:
    """The results root holding `run_dir` (a local path or a URI), in the form it came in."""
    if isinstance(run_dir, Path):
        return run_dir.parent
    return str(run_dir).rstrip("/").rpartition("/")[0] or "."


class RunBaselines:
    """The baseline runs of one run's gates: resolved from its results root's catalog once, their
    perf rows read once each, each level's requests drawn once per run and reused by every figure."""

    def __init__(self, run_dir: str | Path, info: RunInfo, perf_requests: pl.DataFrame, perf_levels: pl.DataFrame):
        self.run_dir, self.info, self.root = run_dir, info, results_root(run_dir)
        self.levels = perf_resample.levels(perf_requests, perf_levels)
        self._runs: pl.DataFrame | None = None
        self._loaded: dict[str, tuple[pl.DataFrame, dict[Key, perf_resample.Level]]] = {}
        self._draws: dict[tuple[str, Key], np.ndarray] = {}
        self._figures: dict[tuple[str, Key, str], np.ndarray] = {}

    @property
    def runs(self) -> pl.DataFrame:
        if self._runs is None:
            try:
                self._runs = catalog.runs(self.root).filter(pl.col("run_id") != self.info.run_id)
            except UserError:  # the root cannot be listed (the run directory was copied out alone)
                self._runs = pl.DataFrame(schema=catalog.RUNS_SCHEMA)
        return self._runs

    def resolve(self, gate: Gate, model: str, target: str) -> tuple[list[str], str]:
        """(the baseline runs' ids, oldest first, "") or ([], why there is none)."""
        runs = self.runs
        if gate.baseline != LATEST_PASS:
            missing = [name for name in gate.baseline_runs if name not in set(runs["run_id"])]
            if missing:
                return [], f"baseline run {missing[0]} is not in {self.root} ({catalog.listed(runs)})"
            return list(gate.baseline_runs), ""
        started = self.info.started_at or "~"  # "~" sorts after every ISO time: no start time, every run is earlier
        passing = runs.filter(
            pl.col("gates") == "PASS",
            pl.col("started_at") < started,
            pl.col("models").str.split(", ").list.contains(model),
            pl.col("targets").str.split(", ").list.contains(target),
        )
        if passing.is_empty():
            return [], f"no earlier run of {model}/{target} in {self.root} passed its gates"
        return passing.sort("started_at", "run_id")["run_id"].tail(gate.runs or 1).to_list(), ""

    def _load(self, run_id: str) -> tuple[pl.DataFrame, dict[Key, perf_resample.Level]]:
        if run_id not in self._loaded:
            run_dir = store.join(self.root, run_id)
            tables = reader.load(run_dir)
            requests, levels = first_runs(tables["perf_requests"]), first_runs(tables["perf_levels"])
            figures = perf_summary(requests, levels, slos(reader.read_info(run_dir))) if levels.height else None
            self._loaded[run_id] = (
                figures if figures is not None else pl.DataFrame(),
                perf_resample.levels(requests, levels),
            )
        return self._loaded[run_id]

    def _resampled(self, run_id: str, key: Key, level: perf_resample.Level, column: str) -> np.ndarray:
        """`column` on each request resample of one run's level; the seed is the run's and level's own,
        so the measured run and its baselines do not share draws, and a verdict never depends on order."""
        if (run_id, key) not in self._draws:
            seed = zlib.crc32("/".join(map(str, (run_id, *key))).encode())
            self._draws[(run_id, key)] = perf_resample.level_draws(level, seed=seed)
        if (run_id, key, column) not in self._figures:
            self._figures[(run_id, key, column)] = level.figure(column, self._draws[(run_id, key)])
        return self._figures[(run_id, key, column)]

    def judge(self, gate: Gate, model: str, target: str, measured: float) -> dict[str, Any]:
        """The verdict-row fields of `gate` on a measured value against its baseline runs."""
        assert gate.scenario is not None and gate.level is not None
        run_ids, why = self.resolve(gate, model, target)
        if not run_ids:
            skip = gate.baseline == LATEST_PASS
            note = ": nothing to compare with (a series' first run), skipped" if skip else ""
            return {"verdict": "SKIP" if skip else "FAIL", "reason": why + note}
        column = gate.metric.removeprefix("perf_")
        key = (model, target, gate.scenario, gate.level)
        row: dict[str, Any] = {"baseline_run": ", ".join(run_ids)}
        observed, resampled = [], []
        for run_id in run_ids:
            figures, levels = self._load(run_id)
            base = _value(figures, key, column)
            if base is None or key not in levels or key not in self.levels or base == 0:
                where = f"{model}/{target} {gate.scenario} @ {gate.level}"
                return row | {"verdict": "FAIL", "reason": f"baseline run {run_id} has no {gate.metric} for {where}"}
            observed.append(base)
            resampled.append(self._resampled(run_id, key, levels[key], column))
        ratios = perf_resample.runs_ratios(
            self._resampled(self.info.run_id, key, self.levels[key], column), resampled, observed
        )
        low, high = perf_resample.bounds(ratios)
        base, spread = float(np.mean(observed)), perf_resample.spread(observed)
        ratio = gate.ratio or 0.0
        row |= {"baseline": base, "threshold": ratio * base, "ci_low": low, "ci_high": high}
        row["baseline_spread"] = spread if len(run_ids) > 1 else None
        against = run_ids[0] if len(run_ids) == 1 else f"mean({len(run_ids)} runs)"
        if low != low:  # NaN: too few defined resamples
            return row | {"verdict": "FAIL", "reason": f"no interval of measured / {against}: too few requests"}
        # The end of the interval most favourable to the candidate must fail the bound for a FAIL.
        end = high if gate.op in (">=", ">") else low
        passed = OPS[gate.op](end, ratio)
        # What the interval came from goes last: the text summary cuts a cell at 80 characters, and the
        # ratio, its interval and the verdict come first (the runs and their spread have columns too).
        if len(run_ids) == 1:
            source = "vs 1 baseline run: request noise only"
        else:
            source = f"vs {len(run_ids)} baseline runs, {', '.join(run_ids)}; run-to-run spread {spread * 100:.1f} %"
        reason = (
            f"measured / {against} = {measured / base:.4f}, 95 % CI [{low:.4f}, {high:.4f}]; "
            f"{'some' if passed else 'no'} value in it is {gate.op} {ratio:g} ({source}){_fewer(gate, run_ids)}"
        )
        return row | {"verdict": "PASS" if passed else "FAIL", "reason": reason}


def _fewer(gate: Gate, run_ids: list[str]) -> str:
    asked = gate.runs or 1
    if len(run_ids) >= asked:
        return ""
    return f"; only {len(run_ids)} of the {asked} earlier passing runs asked for (runs: {asked}): judged on those"


def _value(figures: pl.DataFrame, key: Key, column: str) -> float | None:
    if figures.is_empty():
        return None
    model, target, scenario, level = key
    rows = figures.filter(
        pl.col("model") == model, pl.col("target") == target, pl.col("scenario") == scenario, pl.col("level") == level
    )
    value = rows[column][0] if rows.height else None
    return None if value is None or value != value else float(value)
