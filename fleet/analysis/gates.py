"""Pass/fail gates: thresholds on a run's metrics, applied per model x candidate target.

A gate names one metric (a column of parity.parity or throughput.throughput, or of a probe table
registered in METRICS), an operator and a threshold, e.g. `pearson_r >= 0.99`. With `baseline`,
the bound is `ratio` times a stored value, `output_tok_s >= 0.95 x 948.3`, or times an earlier
run's figure, judged on a bootstrap interval (fleet/analysis/baseline.py). Every verdict row
says what was measured, against what, and `evidence`: a Polars expression that reads the stored
rows the metric was computed from, so a FAIL can be checked by hand. A metric that could not be
measured (null, NaN, or no result for the target at all) is a FAIL with a reason, never a PASS,
and so is every gate of a (model, target) whose run is incomplete (`incomplete`): a failed target
or shard, or prompts the reference answered and the candidate did not. Metrics are computed on
the rows both sides have, so without that check a partial run would pass on what it kept.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from pydantic import ValidationError

from fleet.analysis import key_blocks
from fleet.contracts.errors import UserError
from fleet.contracts.gates import METRICS, OPS, Gate
from fleet.contracts.inputs import load_yaml, read_text
from fleet.contracts.messages import error_line, relevant
from fleet.results import store
from fleet.results.info import RunInfo

if TYPE_CHECKING:
    from fleet.analysis.baseline import RunBaselines


VERDICT_COLUMNS = [
    "gate", "model", "target", "metric", "value", "op", "threshold", "baseline", "baseline_run", "baseline_spread",
    "ci_low", "ci_high", "verdict", "reason",
]  # fmt: skip
# Passes the run: PASS, and SKIP (a gate against latest-pass with no passing run before it, fleet/analysis/baseline.py).
NOT_FAILED = ("PASS", "SKIP")


def parse(raw: Any, *, source: str = "gates") -> list[Gate]:
    """Validate a list of gate mappings (the manifest's `gates:` section or a gates file)."""
    if isinstance(raw, dict) and set(raw) == {"gates"}:
        raw = raw["gates"]
    if not isinstance(raw, list):
        msg = f"{source}: expected a list of gates ({{metric, op, threshold, ...}})"
        raise UserError(msg)
    gates, errors = [], []
    for i, item in enumerate(raw):
        try:
            gates.append(Gate.model_validate(item))
        except ValidationError as e:
            errors += [
                f"  gates[{i}].{error_line(err, item, model=Gate)}" for err in relevant(e.errors(include_url=False))
            ]
    if errors:
        raise UserError("\n".join([f"{source}: {len(errors)} error(s)", *errors]))
    return gates


def load(path: str | Path) -> list[Gate]:
    """Gates from a YAML file: a list, or a mapping with one key `gates`."""
    path = Path(path)
    raw = load_yaml(read_text(path, what="gates file"), source=str(path))
    return parse(raw, source=str(path))


def evidence(run_dir: str | Path, metric: str, model: str, target: str, *, reference: str) -> str:
    """A Polars expression that scans exactly the rows `metric` was computed from for model/target."""
    table, with_reference, extra = METRICS[metric]
    targets = [target, reference] if with_reference and target != reference else [target]
    glob = str(store.join(run_dir, table, f"model={model}", "**", "*.parquet"))
    conditions = [f'(pl.col("model") == {json.dumps(model)})', f'pl.col("target").is_in({json.dumps(targets)})']
    conditions += [f"({extra})"] if extra else []
    return f"pl.scan_parquet({json.dumps(glob)}, hive_partitioning=False).filter({' & '.join(conditions)})"


def evaluate(
    gates: Sequence[Gate],
    parity_df: pl.DataFrame,
    throughput_df: pl.DataFrame,
    *,
    run_dir: str | Path,
    reference: str,
    expected: Iterable[tuple[str, str]] = (),
    extra: Sequence[pl.DataFrame] = (),
    doubles: Iterable[str] = (),
    incomplete: Mapping[tuple[str, str], str] | None = None,
    runs: RunBaselines | None = None,
) -> pl.DataFrame:
    """One verdict row per gate x selected (model, target), columns VERDICT_COLUMNS + evidence.

    Selected pairs are those with any result (or listed in `expected`, e.g. the manifest's models x
    targets, so a target that failed outright is a FAIL rather than absent), minus the reference
    unless a gate names it. `extra` holds probe frames keyed by model/target with metric columns.
    `doubles` are targets that ran the test double (no model): no gate passes on one of them, or
    on anything compared with a test-double reference. `incomplete` maps a (model, target) to why
    its results are incomplete (see `incomplete`): each of its gates fails with that reason.
    `runs` judges gates whose baseline is a run (fleet/analysis/baseline.py); without it they fail.
    """
    incomplete = incomplete or {}
    doubles = set(doubles)
    measured: dict[tuple[str, str, str], Any] = {}
    for frame in (parity_df, throughput_df, *extra):
        for row in frame.iter_rows(named=True):
            for metric, value in row.items():
                measured.setdefault((row["model"], row["target"], metric), value)
    with_results = {(m, t) for m, t, _ in measured}
    pairs = sorted(with_results | set(expected))
    rows = []
    for gate in gates:
        for model, target in _selected(gate, pairs, reference):
            value = measured.get((model, target, gate.key))
            rows.append(_verdict(gate, model, target, value, (model, target) in with_results, runs))
            why = incomplete.get((model, target))
            if why is not None and rows[-1]["verdict"] in NOT_FAILED:
                rows[-1] |= {"verdict": "FAIL", "reason": f"incomplete, never a PASS: {why}"}
            double = next((t for t in (target, reference) if t in doubles), None)
            if double is not None and rows[-1]["verdict"] in NOT_FAILED:
                judged = f" (against its baseline: {rows[-1]['verdict']}, {rows[-1]['reason']})"
                was = judged if gate.baseline_runs else ""
                rows[-1] |= {
                    "verdict": "FAIL",
                    "reason": f"{double} is a test double (no model ran): never a PASS{was}",
                }
            rows[-1]["evidence"] = evidence(run_dir, gate.metric, model, target, reference=reference)
    numeric = ("value", "threshold", "baseline", "baseline_spread", "ci_low", "ci_high")
    schema = {c: pl.Float64 if c in numeric else pl.String for c in VERDICT_COLUMNS}
    return pl.DataFrame(rows, schema={**schema, "evidence": pl.String})


def _selected(gate: Gate, pairs: list[tuple[str, str]], reference: str) -> list[tuple[str, str]]:
    models = gate.models or sorted({m for m, _ in pairs})
    if not models:  # nothing ran and nothing was expected: a gate with nothing to check fails
        return [("*", "*")]
    if gate.targets is not None:  # named targets are checked even when they have no results
        return [(m, t) for m in models for t in gate.targets]
    selected = [(m, t) for m, t in pairs if m in models and t != reference]
    # A named model with no candidate results must not pass by having nothing to check.
    return selected + [(m, "*") for m in models if m not in {s[0] for s in selected}]


def _verdict(
    gate: Gate, model: str, target: str, value: Any, has_results: bool, runs: RunBaselines | None
) -> dict[str, Any]:
    threshold, baseline = gate.bound(model, target)
    row: dict[str, Any] = {"gate": gate.label, "model": model, "target": target, "metric": gate.metric, "op": gate.op}
    row |= {"threshold": threshold, "baseline": baseline, "value": None, "verdict": "FAIL"}
    row |= {"baseline_run": None, "baseline_spread": None, "ci_low": None, "ci_high": None}
    if not has_results:
        return row | {"reason": "no results for this model/target (failed, not run, or misspelt)"}
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return row | {"reason": f"{gate.metric} not measured (null or NaN) for this model/target"}
    value = float(value)
    if gate.baseline_runs:
        if runs is None:
            named = ", ".join(gate.baseline_runs)
            return row | {"value": value, "reason": f"baseline run {named}: no results root to look in"}
        return row | {"value": value} | runs.judge(gate, model, target, value)
    if threshold is None:
        return row | {"value": value, "reason": f"no baseline for {model}/{target}"}
    passed = OPS[gate.op](value, threshold)
    return row | {
        "value": value,
        "verdict": "PASS" if passed else "FAIL",
        "reason": f"{value:.6g} {gate.op} {threshold:.6g} is {'true' if passed else 'false'}",
    }


def passed(verdicts: pl.DataFrame) -> bool:
    """True iff no verdict is FAIL: each is PASS or SKIP (and so also when there are no gates)."""
    return bool(verdicts["verdict"].is_in(NOT_FAILED).all()) if verdicts.height else True


def from_info(info: RunInfo) -> list[Gate]:
    """The gates recorded in run.json (the validated manifest's `gates:` section), if any."""
    return parse([_migrated(g) for g in info.manifest_resolved.get("gates") or []], source="run.json gates")


def _migrated(recorded: Any) -> Any:
    """A gate as run.json recorded it before `ratio` existed: a stored baseline's factor was
    `threshold`; it is `ratio` now (threshold is only ever a bound)."""
    if isinstance(recorded, dict) and recorded.get("baseline") is not None and recorded.get("ratio") is None:
        return {k: v for k, v in recorded.items() if k not in ("threshold", "ratio")} | {"ratio": recorded["threshold"]}
    return recorded


def test_doubles(info: RunInfo) -> list[str]:
    """Targets whose recorded provenance says the test double ran them (actors/test_double.py)."""
    found = [key for key, p in info.provenance.items() if isinstance(p, dict) and p.get("device") == "test-double"]
    return sorted({key.split("/", 1)[-1] for key in found})


def expected_pairs(info: RunInfo) -> list[tuple[str, str]]:
    """Every (model, target) the run's manifest asked for, from run.json; a failed one still counts."""
    return [(m, t["name"]) for m in info.model_names for t in info.targets]


def incomplete(
    info: RunInfo, requests: pl.DataFrame, blocks: key_blocks.Blocks | None = None
) -> dict[tuple[str, str], str]:
    """(model, target) -> why its results are incomplete: the target failed or was not run, some
    of its shards (or probes, or perf levels) failed, or it lacks prompts the reference answered.
    A failed reference leaves every candidate of its model incomplete: their rows are not compared.
    `blocks`: key_blocks.blocks of the requests' keys, where the caller has them."""
    reference = info.reference
    models = set(info.model_names) | set(requests["model"].unique())
    targets = {t["name"]: t for t in info.targets}
    found: dict[tuple[str, str], list[str]] = {}
    for key, reason in info.failures.items():  # "model/target"
        model, _, target = key.partition("/")
        found.setdefault((model, target), []).append(f"failed: {reason}")
    for shard in info.failed_shards:  # "model/target/..."
        model, _, rest = shard.partition("/")
        found.setdefault((model, rest.split("/")[0]), []).append(f"failed shard {shard}")
    # Coverage: every parity candidate answers every prompt the reference answered.
    n_ref, n_both = _answered(requests, reference, blocks)
    for model in models:
        answered = n_ref.get(model, 0)
        for name, spec in targets.items():
            if name == reference or spec.get("parity") is False:
                continue
            missing = answered - n_both.get((model, name), 0)
            if missing:
                found.setdefault((model, name), []).append(f"{missing} of the reference's {answered} prompts missing")
    for model, target in list(found):
        if target == reference:
            for name in targets.keys() - {reference}:
                found.setdefault((model, name), []).append(f"the reference {reference} is incomplete")
    return {pair: "; ".join(reasons)[:300] for pair, reasons in found.items()}


def _answered(
    requests: pl.DataFrame, reference: str, blocks: key_blocks.Blocks | None = None
) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Per model, how many distinct prompts the reference answered; per (model, target), how many
    of those the target answered. Counted from the blocks where the requests are in them
    (fleet/analysis/key_blocks.py), else in Polars: not as Python sets, a demo run at 10 M token
    rows has ~900k (target, prompt) pairs."""
    found = blocks or key_blocks.blocks(requests.select("model", "target", "prompt_set", "prompt_id"))
    if found is not None:  # every target of a model answered the same prompts, none twice
        sizes = {(model, target): end - first for model, target, first, end in found.runs.iter_rows()}
        n_ref = {model: n for (model, target), n in sizes.items() if target == reference}
        return n_ref, {(model, target): n_ref[model] for model, target in sizes if model in n_ref}
    keys = ["model", "prompt_set", "prompt_id"]
    ref = requests.filter(pl.col("target") == reference).select(keys).unique()
    both = requests.select("target", *keys).unique().join(ref, on=keys, how="semi", nulls_equal=True)
    n_both = {(m, t): n for m, t, n in both.group_by("model", "target").len().iter_rows()}
    return dict(ref.group_by("model").len().iter_rows()), n_both
