"""The seed adaptation reports' own shapes: for a run whose manifest sets `report: {layout: ...}`
(manifests/reports/), the sections that seed report has, in its order, with its column names in
English, built from the same RunReport as every other section.

A figure the run did not measure (an NPU-only number on a CPU run, a probe that was not asked
for) is a section that says "not measured on this run": never a value copied from the seed.
Every format (text, Markdown, HTML) prints these sections before the standard ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl

from fleet.analysis import probes
from fleet.report.model import RunReport
from fleet.report.sections import NOT_MEASURED, Block, Section, Table, sections
from fleet.report.stages import stage_result

_SEQ = {
    "target": "candidate",
    "prompt_set": "set",
    "prompt_id": "prompt",
    "ref_text": "reference output",
    "cand_text": "candidate output",
}
_PERF = {"target": "target", "scenario": "scenario", "level": "concurrency", "n_completed": "requests"}


def layout(report: RunReport) -> str | None:
    return ((report.info.get("manifest_resolved") or {}).get("report") or {}).get("layout")


def seed_sections(report: RunReport) -> tuple[str, list[Section]] | None:
    """(the seed report's title, its sections) when the run's manifest names a layout, else None."""
    name = layout(report)
    if name is None:
        return None
    title, build = LAYOUTS[name]
    return f"{title} (seed report {name}, reproduced on this run)", build(report, sections(report))


def _s(key: str, title: str, blocks: list[Block], absent: str = NOT_MEASURED) -> Section:
    return Section(f"seed-{key}", title, blocks, absent)


def _t(frame: pl.DataFrame | None, cols: dict[str, str], **kw: Any) -> list[Block]:
    if frame is None or frame.is_empty():
        return []
    return [Table(frame, {"model": "model", **cols}, **kw)]


def _pct(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def _num(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _manifest(r: RunReport) -> dict[str, Any]:
    return r.info.get("manifest_resolved") or {}


def _scenarios(r: RunReport, pred: Callable[[dict[str, Any]], bool]) -> pl.DataFrame | None:
    """The perf levels of the scenarios `pred` selects (by the manifest's scenario dict)."""
    names = [s["name"] for s in _manifest(r).get("perf", []) if pred(s)]
    if r.scenarios is None or not names:
        return None
    return r.scenarios.filter(pl.col("scenario").is_in(names))


def _conditions(r: RunReport) -> list[str]:
    """Each perf scenario's test conditions, as the seeds state them."""
    return [
        f"{s['name']}: {s['num_requests']} requests per level at concurrency {s['concurrency']}, "
        + (f"{s['input_tokens']} input tokens" if s.get("input_tokens") else f"prompts of set {s['prompt_set']}")
        + f", {s['output_tokens']} output tokens (ignore_eos), warm-up {s['warmup_requests']}"
        for s in _manifest(r).get("perf", [])
    ]


def _dummy(target: dict[str, Any]) -> bool:
    return (target.get("engine_args") or {}).get("load_format") == "dummy"


# --- 001: Llama-3.2-3B-Instruct (layer-wise hidden states, token match, eager perf) ----------


def _llama32(r: RunReport, std: dict[str, Section]) -> list[Section]:
    curve = r.layers
    summary, bars = [], None
    if curve is not None:
        for row in probes.layer_summary(curve).iter_rows(named=True):
            summary.append(
                f"{row['model']} / {row['target']}: average Rel L2 error {_pct(row['layer_rel_l2_mean'])}, "
                f"worst {_pct(row['layer_rel_l2_max'])} (layer {row['worst_layer']}), every layer's cosine "
                f"similarity >= {_num(row['layer_cosine_min'], '.6f')}"
            )
        bars, fits = _growth(curve)
        summary += fits
    probe = (_manifest(r).get("probes") or {}).get("layers") or {}
    texts = [
        p.get("prompt") or json.dumps(p.get("messages"))
        for p in _manifest(r)["prompts"].get(probe.get("prompt_set"), [])
    ]
    inputs = [f"Input: {t!r}; reference {r.reference} vs each candidate, layer by layer" for t in texts]
    layer_cols = {"target": "candidate", "layer": "layer", "kind": "kind", "rel_l2": "Rel L2 error"}
    layer_cols |= {"cosine": "cosine similarity", "cosine_min": "cosine min", "max_abs_err": "max abs error"}
    eager = _scenarios(r, lambda s: True)
    perf_cols = _PERF | {"output_tok_s": "output tok/s", "ttft_p50_s": "TTFT p50 s", "tpot_p50_s": "TPOT p50 s"}
    perf_cols |= {"e2e_p50_s": "E2E p50 s", "qps": "QPS"}
    return [
        _s("model", "1. Introduction: model information", std["architecture"].blocks),
        _s("env", "1. Introduction: environment information", std["environment"].blocks),
        _s(
            "hidden",
            "4.2 Hidden-state layer-wise precision",
            [inputs, *_t(curve, layer_cols), summary] if curve is not None else [],
        ),
        _s("logits", "4.3 Logits precision", std["logits"].blocks),
        _s("tokens", "4.4 Token output precision (greedy decoding, temperature 0)", _token_match(r)),
        _s("curve", "4.5 Error analysis: error accumulation across layers (Rel L2 by depth)", bars or []),
        _s(
            "perf",
            "5.1 Inference performance (eager mode)",
            [*_t(eager, perf_cols), _conditions(r)] if eager is not None else [],
        ),
        _s("resources", "5.2 Resource usage", [], f"{NOT_MEASURED} (fleet-eval records no device memory figures)"),
        _s("function", "6. Functional verification (chat completion)", std["smoke"].blocks),
        _s("summary", "8. Adaptation summary (gates)", std["gates"].blocks, std["gates"].absent),
    ]


def _token_match(r: RunReport) -> list[Block]:
    if r.sequences.is_empty():
        return []
    cols = _SEQ | {"match": "match", "first_divergence": "diverges at token", "kind": "divergence kind"}
    totals = [
        f"{p['model']} / {p['target']}: overall token match {p['tokens_matched']}/{p['tokens_total']} = "
        f"{_pct(p['token_match_rate'], 1)}; sequences identical {round(p['seq_match_rate'] * p['n_prompts'])}/"
        f"{p['n_prompts']}"
        for p in r.parity.iter_rows(named=True)
    ]
    return [*_t(r.sequences, cols, wrap=("ref_text", "cand_text")), totals]


def _growth(curve: pl.DataFrame) -> tuple[list[Block], list[str]]:
    """The error-growth curve as the seed draws it (a bar per layer), and a linear fit's R²."""
    scale = curve["rel_l2"].max() or 1.0
    drawn = curve.with_columns(
        curve=pl.col("rel_l2").map_elements(lambda v: "▏" + "█" * round(24 * v / scale), return_dtype=pl.String)
    )
    fits = []
    for (model, target), group in curve.filter(pl.col("kind") == "decoder").group_by("model", "target"):
        x, y = group["layer"].to_numpy().astype(float), group["rel_l2"].to_numpy().astype(float)
        if len(x) >= 3 and np.isfinite(y).all():
            pred = np.polyval(np.polyfit(x, y, 1), x)
            r2 = 1 - float(np.sum((y - pred) ** 2)) / max(float(np.sum((y - y.mean()) ** 2)), 1e-300)
            fits.append(f"{model} / {target}: linear fit of Rel L2 over the decoder layers, R² = {r2:.3f}")
    cols = {"target": "candidate", "layer": "layer", "kind": "kind", "rel_l2": "Rel L2 error", "curve": "curve"}
    return _t(drawn, cols), fits


# --- 002: Qwen2.5-0.5B (random weights, full logits; dummy-weight perf) --------------------


def _qwen25(r: RunReport, std: dict[str, Section]) -> list[Section]:
    perf = _scenarios(r, lambda s: True)
    perf_cols = _PERF | {"output_tok_s": "throughput (output tok/s)", "total_tok_s": "total tok/s", "qps": "QPS"}
    perf_cols |= {"ttft_p50_s": "TTFT p50 s", "tpot_p50_s": "TPOT p50 s", "e2e_p50_s": "latency p50 s"}
    dummies = [t["name"] for t in _manifest(r).get("targets", []) if _dummy(t)]
    weights = [f"dummy-weight targets (load_format: dummy): {', '.join(dummies) or 'none'}", *_conditions(r)]
    logits = r.tables["logits"]
    measured = logits.height > 0
    per_sample = probes.logits_errors(logits, r.reference) if measured else None
    spread = probes.logits_distribution(logits, r.reference) if measured else None
    summary_cols = {"target": "candidate", "n_positions": "samples", "logits_nmse_max": "normalized MSE (max)"}
    summary_cols |= {"logits_cosine_min": "cosine similarity (min)", "logits_max_abs_err": "max abs error"}
    summary_cols |= {"logits_top1_agreement": "top-1 match", "logits_top5_agreement": "top-5 match"}
    sample_cols = {"target": "candidate", "prompt_id": "sample", "nmse": "normalized MSE", "cosine": "cosine"}
    sample_cols |= {"max_abs_err": "max abs error", "kl": "KL", "top1_match": "top-1", "top5_match": "top-5"}
    spread_cols = {"target": "candidate", "n_elements": "elements", "err_mean": "mean error (bias)"}
    spread_cols |= {"abs_err_p50": "|error| p50", "abs_err_p99": "|error| p99", "abs_err_max": "|error| max"}
    spread_cols |= {"within_bound": "share |error| < bound", "bound": "bound"}
    vocab = ", ".join(f"{m}: vocab_size {a.get('vocab_size')}" for m, a in r.architecture.items())
    method = f"Full-vocabulary logprobs after the last prompt token ({vocab}), each candidate against the "
    method += f"reference {r.reference} on the same prompt token ids."
    return [
        _s("env", "2. Environment", std["environment"].blocks),
        _s(
            "perf",
            "4. Performance evaluation (dummy weights)",
            [*_t(perf, perf_cols), weights] if perf is not None else [],
        ),
        _s("method", "5.1 Evaluation method", [method] if measured else []),
        _s("logits", "5.2 Precision comparison results", _t(r.logits, summary_cols)),
        _s("samples", "5.3 Per-sample error analysis", _t(per_sample, sample_cols)),
        _s("spread", "5.4 Error distribution (full vocabulary, logprobs in nats)", _t(spread, spread_cols)),
        _s("verdict", "5.5 Precision verdict (gates)", std["gates"].blocks, std["gates"].absent),
    ]


# --- 003: Qwen-7B (the playbook: dummy then real weights, readiness, matrix, perf) ----------


def _qwen7b(r: RunReport, std: dict[str, Section]) -> list[Section]:
    smoke = r.smoke
    ready = smoke.filter(pl.col("check") == "models") if smoke is not None else None
    infer = smoke.filter(pl.col("check") != "models") if smoke is not None else None
    smoke_cols = {"target": "target", "check": "route", "status": "HTTP", "passed": "passed", "latency_s": "latency s"}
    matrix = [
        Table(b.frame, {"model": "model", "variant": "variant", "settings": "feature", "started": "status",
                        "gates": "gates", "output_tok_s": "out tok/s", "failure": "note"})
        if isinstance(b, Table) and "variant" in b.frame.columns else b
        for b in std["matrix"].blocks
    ]  # fmt: skip
    parity_cols = {"target": "candidate", "n_prompts": "prompts", "kl_topk_mean": "token distribution KL (top-k)"}
    parity_cols |= {
        "seq_match_rate": "output match",
        "token_match_rate": "token match",
        "tf_top1_agreement": "TF top-1",
    }
    parity_cols |= {"near_ties": "near ties", "real_divergences": "real divergences"}
    perf = _scenarios(r, lambda s: True)
    perf_cols = {"target": "target", "scenario": "scenario", "level": "batch size", "output_tok_s": "decode tok/s"}
    perf_cols |= {"prefill_tok_s": "prefill tok/s", "ttft_p50_s": "TTFT p50 s", "tpot_p50_s": "TPOT p50 s"}
    return [
        _s("stages", "Step 7. Two-stage verification (A: dummy fast gate, B: real-weight gate)", _stages(r)),
        _s(
            "ready",
            "Step 8.1 Readiness check (/v1/models)",
            _t(ready, smoke_cols | {"response": "response"}, wrap=("response",)),
        ),
        _s(
            "infer",
            "Step 8.2 Text inference (completions, chat)",
            _t(infer, smoke_cols | {"response": "response"}, wrap=("response",)),
        ),
        _s("matrix", "Step 8.3 Feature status matrix", matrix),
        _s("precision", "4.2 Precision verification (vs reference)", _t(r.parity, parity_cols)),
        _s("perf", "4.3 Performance baseline", [*_t(perf, perf_cols), _conditions(r)] if perf is not None else []),
        _s("verdict", "Verdict (gates)", std["gates"].blocks, std["gates"].absent),
    ]


def _stages(r: RunReport) -> list[Block]:
    """Each candidate in manifest order: its weights, what it waited on, and how it ended."""
    failures, provenance = r.info.get("failures") or {}, r.info.get("provenance") or {}
    smoke = r.smoke
    rows = []
    for model in r.models:
        for t in _manifest(r).get("targets", []):
            if t["name"] == r.reference:
                continue
            key = f"{model}/{t['name']}"
            mine = (
                smoke.filter((pl.col("model") == model) & (pl.col("target") == t["name"]))
                if smoke is not None
                else None
            )
            checks = None if mine is None or mine.is_empty() else f"{int(mine['passed'].sum())}/{mine.height} passed"
            rows.append(
                {
                    "model": model,
                    "target": t["name"],
                    "weights": "dummy" if _dummy(t) else "real",
                    "after": t.get("after"),
                    "started": key in provenance and key not in failures,
                    "smoke": checks,
                    "result": stage_result(r, model, t["name"]),
                }
            )
    frame = pl.DataFrame(rows, schema=dict.fromkeys(["model", "target", "weights", "after"], pl.String)
                         | {"started": pl.Boolean, "smoke": pl.String, "result": pl.String})  # fmt: skip
    cols = {"target": "target", "weights": "weights", "after": "runs after", "started": "started"}
    return _t(frame, cols | {"smoke": "smoke checks", "result": "result"}, wrap=("result",))


# --- 004: OpenELM-3B (task accuracy on a GSM8K-shaped set, worked examples, latency / QPS) --


def _openelm(r: RunReport, std: dict[str, Section]) -> list[Section]:
    acc_cols = {"target": "device (target)", "n_expected": "problems", "n_correct": "correct"}
    acc_cols |= {"accuracy_pct": "accuracy %", "delta_points": "error vs reference (points)"}
    examples = None
    if r.accuracy is not None:
        req = r.tables["requests"].filter(pl.col("target") == r.reference)
        expected = req.filter(pl.col("expected").is_not_null()).select(
            "model",
            "prompt_set",
            "prompt_id",
            expected=pl.col("expected").map_elements(_expected_value, return_dtype=pl.String),
            # The chat turns where the requests table keeps them; else the prompt as rendered.
            question=pl.when(pl.col("messages").is_null())
            .then(pl.col("prompt"))
            .otherwise(pl.col("messages").map_elements(_question, return_dtype=pl.String))
            if "messages" in req.columns
            else pl.col("prompt"),
        )
        examples = r.sequences.join(expected, on=["model", "prompt_set", "prompt_id"], how="inner")
    ex_cols = {"target": "candidate", "prompt_id": "problem", "question": "input", "expected": "expected output"}
    ex_cols |= {"ref_text": "reference output", "ref_correct": "reference status"}
    ex_cols |= {"cand_text": "candidate output", "cand_correct": "status"}
    perf = _scenarios(r, lambda s: True)
    perf_cols = _PERF | {"e2e_p50_s": "P50 latency s", "e2e_p90_s": "P90 latency s", "e2e_p99_s": "P99 latency s"}
    perf_cols |= {"output_tok_s": "throughput tok/s", "qps": "QPS"}
    return [
        _s("overview", "Model overview (architecture)", std["architecture"].blocks),
        _s("accuracy", "Precision comparison: GSM8K-format benchmark", _t(r.accuracy, acc_cols)),
        _s("examples", "Test case examples", _t(examples, ex_cols, wrap=("question", "ref_text", "cand_text"))),
        _s("perf", "Performance benchmark", [*_t(perf, perf_cols), _conditions(r)] if perf is not None else []),
        _s("verdict", "Verification results (gates)", std["gates"].blocks, std["gates"].absent),
    ]


def _question(messages: str) -> str:
    """The last user turn of a chat prompt: what was asked, without the template around it."""
    turns = [m["content"] for m in json.loads(messages) if m.get("role") == "user"]
    return turns[-1] if turns else messages


def _expected_value(rule: str) -> str:
    [(kind, value)] = json.loads(rule).items()
    return f"{value:g}" if kind == "number" else f"{kind}: {value}"


LAYOUTS: dict[str, tuple[str, Callable[[RunReport, dict[str, Section]], list[Section]]]] = {
    "001-llama-3.2-3b": ("Llama-3.2-3B-Instruct adaptation report", _llama32),
    "002-qwen2.5-0.5b": ("Qwen2.5-0.5B adaptation report", _qwen25),
    "003-qwen-7b": ("Qwen-7B adaptation playbook report", _qwen7b),
    "004-openelm-3b": ("OpenELM-3B adaptation model card", _openelm),
}
