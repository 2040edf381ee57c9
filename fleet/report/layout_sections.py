"""Sections only the seed adaptation reports have (fleet/report/layouts/*.yaml places them):
registered like every other section, but not standard (a report shows them only through a
layout). Their column names are the seed reports' own, in English; a layout may rename them.
"""

from __future__ import annotations

import json

import polars as pl

from fleet.analysis import growth, probes
from fleet.report.blocks import Block, SectionSpec, register
from fleet.report.model import RunReport
from fleet.report.stages import stage_result

SEED = "Seed reports"  # their chapter, should a standard report ever show one


def _pct(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def _num(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


LAYER_GROWTH = {"model": "model", "target": "candidate", "layer": "layer", "kind": "kind"}
LAYER_GROWTH |= {"rel_l2": "Rel L2 error", "cosine": "cosine similarity", "cosine_min": "cosine min"}
LAYER_GROWTH |= {"max_abs_err": "max abs error"}


@register("layer_growth", "Hidden-state layer-wise precision", chapter=SEED, standard=False, columns=LAYER_GROWTH)
def _layer_growth(r: RunReport, spec: SectionSpec) -> list[Block]:
    """Seed 001 §4.2: the probe's input, the per-layer errors and the summary lines."""
    if r.layers is None:
        return []
    summary = [
        f"{row['model']} / {row['target']}: average Rel L2 error {_pct(row['layer_rel_l2_mean'])}, "
        f"worst {_pct(row['layer_rel_l2_max'])} (layer {row['worst_layer']}), every layer's cosine "
        f"similarity >= {_num(row['layer_cosine_min'], '.6f')}"
        for row in probes.layer_summary(r.layers).iter_rows(named=True)
    ]
    summary += [
        f"{f['model']} / {f['target']}: linear fit of Rel L2 over the decoder layers, R² = {f['r2']:.3f}"
        for f in growth.linear_fit(r.layers).iter_rows(named=True)
    ]
    probe = r.info.probes.get("layers") or {}
    texts = [
        p.get("prompt") or json.dumps(p.get("messages")) for p in r.info.prompts.get(str(probe.get("prompt_set")), [])
    ]
    inputs = [f"Input: {t!r}; reference {r.reference} vs each candidate, layer by layer" for t in texts]
    return [inputs, *spec.table(r.layers), summary]


LAYER_BARS = {"model": "model", "target": "candidate", "layer": "layer", "kind": "kind"}
LAYER_BARS |= {"rel_l2": "Rel L2 error", "curve": "curve"}


@register("layer_bars", "Error accumulation across layers (Rel L2 by depth)", chapter=SEED, standard=False,
          columns=LAYER_BARS)  # fmt: skip
def _layer_bars(r: RunReport, spec: SectionSpec) -> list[Block]:
    """Seed 001 §4.5: the error-growth curve as the seed draws it, a bar per layer."""
    if r.layers is None:
        return []
    scale = r.layers["rel_l2"].max() or 1.0
    bar = pl.col("rel_l2").map_elements(lambda v: "▏" + "█" * round(24 * v / scale), return_dtype=pl.String)
    return spec.table(r.layers.with_columns(curve=bar))


@register("logits_method", "Evaluation method", chapter=SEED, standard=False)
def _logits_method(r: RunReport, spec: SectionSpec) -> list[Block]:
    if not r.tables["logits"].height:
        return []
    vocab = ", ".join(f"{m}: vocab_size {a.get('vocab_size')}" for m, a in r.architecture.items())
    return [
        f"Full-vocabulary logprobs after the last prompt token ({vocab}), each candidate against the "
        f"reference {r.reference} on the same prompt token ids."
    ]


SAMPLES = {"model": "model", "target": "candidate", "prompt_id": "sample", "nmse": "normalized MSE"}
SAMPLES |= {"cosine": "cosine", "max_abs_err": "max abs error", "kl": "KL", "top1_match": "top-1"}
SAMPLES |= {"top5_match": "top-5"}


@register("logits_samples", "Per-sample error analysis", chapter=SEED, standard=False, columns=SAMPLES)
def _logits_samples(r: RunReport, spec: SectionSpec) -> list[Block]:
    logits = r.tables["logits"]
    return spec.table(probes.logits_errors(logits, r.reference)) if logits.height else []


SPREAD = {"model": "model", "target": "candidate", "n_elements": "elements", "err_mean": "mean error (bias)"}
SPREAD |= {"abs_err_p50": "|error| p50", "abs_err_p99": "|error| p99", "abs_err_max": "|error| max"}
SPREAD |= {"within_bound": "share |error| < bound", "bound": "bound"}


@register("logits_spread", "Error distribution (full vocabulary, logprobs in nats)", chapter=SEED, standard=False,
          columns=SPREAD)  # fmt: skip
def _logits_spread(r: RunReport, spec: SectionSpec) -> list[Block]:
    logits = r.tables["logits"]
    return spec.table(probes.logits_distribution(logits, r.reference)) if logits.height else []


SMOKE = {"model": "model", "target": "target", "check": "route", "status": "HTTP", "passed": "passed"}
SMOKE |= {"latency_s": "latency s", "response": "response"}


@register("smoke_ready", "Readiness check (/v1/models)", chapter=SEED, standard=False, columns=SMOKE)
def _smoke_ready(r: RunReport, spec: SectionSpec) -> list[Block]:
    ready = r.smoke.filter(pl.col("check") == "models") if r.smoke is not None else None
    return spec.table(ready, wrap=("response",))


@register("smoke_inference", "Text inference (completions, chat)", chapter=SEED, standard=False, columns=SMOKE)
def _smoke_inference(r: RunReport, spec: SectionSpec) -> list[Block]:
    infer = r.smoke.filter(pl.col("check") != "models") if r.smoke is not None else None
    return spec.table(infer, wrap=("response",))


STAGES = {"model": "model", "target": "target", "weights": "weights", "after": "runs after"}
STAGES |= {"started": "started", "smoke": "smoke checks", "result": "result"}


@register("stages", "Two-stage verification (A: dummy fast gate, B: real-weight gate)", chapter=SEED,
          standard=False, columns=STAGES)  # fmt: skip
def _stages(r: RunReport, spec: SectionSpec) -> list[Block]:
    """Seed 003 step 7: each candidate in manifest order, its weights, what it waited on, how it ended."""
    failures, provenance = r.info.failures, r.info.provenance
    rows = []
    for model in r.models:
        for t in r.info.targets:
            if t["name"] == r.reference:
                continue
            key = f"{model}/{t['name']}"
            smoke = r.smoke
            mine = None if smoke is None else smoke.filter((pl.col("model") == model) & (pl.col("target") == t["name"]))
            checks = None if mine is None or mine.is_empty() else f"{int(mine['passed'].sum())}/{mine.height} passed"
            rows.append(
                {
                    "model": model,
                    "target": t["name"],
                    "weights": "dummy" if (t.get("engine_args") or {}).get("load_format") == "dummy" else "real",
                    "after": t.get("after"),
                    "started": key in provenance and key not in failures,
                    "smoke": checks,
                    "result": stage_result(r, model, t["name"]),
                }
            )
    schema: dict[str, type[pl.DataType]] = dict.fromkeys(["model", "target", "weights", "after"], pl.String)
    schema |= {"started": pl.Boolean, "smoke": pl.String, "result": pl.String}
    return spec.table(pl.DataFrame(rows, schema=schema), wrap=("result",))


EXAMPLES = {"model": "model", "target": "candidate", "prompt_id": "problem", "question": "input"}
EXAMPLES |= {"expected": "expected output", "ref_text": "reference output", "ref_correct": "reference status"}
EXAMPLES |= {"cand_text": "candidate output", "cand_correct": "status"}


@register("worked_examples", "Test case examples", chapter=SEED, standard=False, columns=EXAMPLES)
def _worked_examples(r: RunReport, spec: SectionSpec) -> list[Block]:
    """Seed 004: each problem with an expected answer, the reference's and the candidate's output."""
    if r.accuracy is None:
        return []
    expected = (
        r.tables["requests"]
        .filter((pl.col("target") == r.reference) & pl.col("expected").is_not_null())
        .select(
            "model",
            "prompt_set",
            "prompt_id",
            expected=pl.col("expected").map_elements(_expected_value, return_dtype=pl.String),
        )
    )
    examples = r.sequences.join(expected, on=["model", "prompt_set", "prompt_id"], how="inner")
    examples = examples.with_columns(question="prompt")  # as the model saw it (a chat prompt with its template)
    return spec.table(examples, wrap=("question", "ref_text", "cand_text"))


def _expected_value(rule: str) -> str:
    [(kind, value)] = json.loads(rule).items()
    return f"{value:g}" if kind == "number" else f"{kind}: {value}"
