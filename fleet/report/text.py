"""The run summary, recomputed from a run directory's Parquet files and run.json alone.

Tables are printed as Markdown, so a summary pastes straight into an adaptation report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from fleet.analysis import consistency
from fleet.analysis import gates as gate_mod
from fleet.analysis import parity as analysis
from fleet.contracts.gates import Gate
from fleet.results import reader
from fleet.results.reader import read_info

PARITY_COLUMNS = {
    "model": "model",
    "target": "candidate",
    "n_prompts": "prompts",
    "first_top1_agreement": "first top-1",
    "first_logprob_diff_mean": "first |dlogp|",
    "first_prob_rel_err_mean": "first P rel err",
    "seq_match_rate": "seq match",
    "token_match_rate": "token match",
    "pearson_r": "r (matched)",
    "mae": "MAE (matched)",
    "tf_top1_agreement": "TF top-1",
    "tf_max_abs_logprob_diff": "TF max |dlogp|",
    "kl_topk_mean": "KL top-k",
    "first_divergence_mean": "first div (mean pos)",
    "n_diverged": "diverged",
}
PERF_COLUMNS = {
    "model": "model",
    "target": "target",
    "n_requests": "requests",
    "output_tokens": "out tokens",
    "output_tok_s": "out tok/s",
    "ttft_p50_s": "TTFT p50 s",
    "ttft_p90_s": "TTFT p90 s",
    "ttft_p99_s": "TTFT p99 s",
    "tpot_p50_s": "TPOT p50 s",
    "tpot_p90_s": "TPOT p90 s",
    "tpot_p99_s": "TPOT p99 s",
    "e2e_p50_s": "E2E p50 s",
    "e2e_p99_s": "E2E p99 s",
}


ANSWER_COLUMNS = {
    "model": "model",
    "target": "candidate",
    "prompt_id": "prompt",
    "ref_text": "reference output",
    "cand_text": "candidate output",
    "match": "match",
    "ref_correct": "ref correct",
    "cand_correct": "cand correct",
}
ACCURACY_COLUMNS = {
    "model": "model",
    "target": "target",
    "n_expected": "prompts",
    "n_correct": "correct",
    "accuracy_pct": "accuracy %",
    "delta_points": "vs reference (points)",
}


SCENARIO_COLUMNS = {
    "model": "model",
    "target": "target",
    "scenario": "scenario",
    "level": "concurrency",
    "n_completed": "done",
    "n_errors": "errors",
    "qps": "QPS",
    "output_tok_s": "out tok/s",
    "total_tok_s": "total tok/s",
    "prefill_tok_s": "prefill tok/s",
    "ttft_p50_s": "TTFT p50 s",
    "ttft_p90_s": "TTFT p90 s",
    "ttft_p99_s": "TTFT p99 s",
    "tpot_p50_s": "TPOT p50 s",
    "tpot_p99_s": "TPOT p99 s",
    "itl_p50_s": "ITL p50 s",
    "itl_p99_s": "ITL p99 s",
    "e2e_p50_s": "E2E p50 s",
    "e2e_p90_s": "E2E p90 s",
    "e2e_p99_s": "E2E p99 s",
    "queue_delay_max_s": "send lag max s",
}
LOGITS_COLUMNS = {
    "model": "model",
    "target": "candidate",
    "n_positions": "positions",
    "logits_cosine_min": "cosine min",
    "logits_nmse_max": "NMSE max",
    "logits_max_abs_err": "max |dlogp|",
    "logits_kl_max": "KL max",
    "logits_kl_mean": "KL mean",
    "logits_top1_agreement": "top-1",
    "logits_top5_agreement": "top-5 set",
}
LAYER_COLUMNS = {
    "model": "model",
    "target": "candidate",
    "layer": "layer",
    "kind": "kind",
    "rel_l2": "rel L2",
    "cosine": "cosine",
    "cosine_min": "cosine min",
    "within_0p1pct": "within 0.1%",
    "within_0p5pct": "within 0.5%",
}
SMOKE_COLUMNS = {"model": "model", "target": "target", "check": "check", "passed": "passed", "status": "HTTP"}


FIRST_STEP_COLUMNS = {
    "model": "model",
    "target": "candidate",
    "prompt_set": "set",
    "prompt_id": "prompt",
    "ref_logprob_of_cand": "ref logprob",
    "cand_logprob": "cand logprob",
    "logprob_diff": "|diff|",
    "p_ref": "ref P",
    "p_cand": "cand P",
    "rel_err": "rel err",
    "top1_match": "top-1 match",
}


def _table(frame: pl.DataFrame, columns: dict[str, str]) -> str:
    frame = frame.select([c for c in columns if c in frame.columns])
    # 4 significant digits: a float32 port's 3e-6 must not print as 0.0000.
    frame = (
        frame.with_columns(
            pl.col(c).map_elements(lambda v: f"{v:.4g}", return_dtype=pl.String)
            for c, dtype in frame.schema.items()
            if dtype.is_float()
        )
        .with_columns(
            # One row per line: generated text shows its line breaks as ⏎.
            pl.col(c).str.replace_all("\n", "⏎", literal=True)
            for c, dtype in frame.schema.items()
            if dtype == pl.String
        )
        .rename(columns, strict=False)
    )
    with pl.Config(
        tbl_formatting="ASCII_MARKDOWN",
        tbl_hide_column_data_types=True,
        tbl_hide_dataframe_shape=True,
        tbl_rows=-1,
        tbl_cols=-1,
        tbl_width_chars=400,
        fmt_str_lengths=80,
    ):
        return str(frame)


@dataclass(frozen=True)
class Summary:
    text: str
    complete: bool  # the run finished with every target and shard
    gates_passed: bool | None  # None: no gates to apply


def render(run_dir: str | Path, *, gates: list[Gate] | None = None) -> Summary:
    """The summary text recomputed from the run's Parquet files, with gate verdicts (the gates
    given, else those of the run's manifest)."""
    info = read_info(run_dir)
    reference = info["reference"]
    tables = {name: frame.collect() for name, frame in reader.load(run_dir).items()}
    out = [
        f"# fleet-eval run {info.get('run_id', run_dir)}",
        f"status: {info.get('status')}  started: {info.get('started_at')}  finished: {info.get('finished_at')}",
        f"manifest: {info.get('manifest_path')} (sha256 {str(info.get('manifest_sha256', ''))[:12]})",
        f"reference: {reference}",
        *_notices(info, tables["requests"]),
    ]
    requests, tokens = tables["requests"], tables["tokens"]
    parity = analysis.parity(requests, tokens, reference)
    out += [
        "",
        "## Parity vs reference (TF = teacher-forced on the candidate's tokens)",
        _table(parity, PARITY_COLUMNS),
    ]
    first = analysis.first_step(tokens, reference)
    out += ["", "## First step per prompt", _table(first, FIRST_STEP_COLUMNS), *_first_step_totals(parity)]
    answers = analysis.answers(requests, reference).with_columns(
        pl.col("match").replace_strict({True: "✅", False: "❌"}, return_dtype=pl.String)
    )
    out += ["", "## Full sequences (greedy)", _table(answers, ANSWER_COLUMNS), *_sequence_totals(parity)]
    measured = Measured.of(tables, reference)
    if measured.accuracy.height:
        out += ["", "## Task accuracy (prompts with an expected answer)", _table(measured.accuracy, ACCURACY_COLUMNS)]
    perf = analysis.throughput(requests, tables["shards"])
    out += [
        "",
        "## Throughput and latency per target (parity runs, engine-side timestamps)",
        _table(perf, PERF_COLUMNS),
    ]
    if tables["perf_levels"].height:
        from fleet.analysis import perf as perf_mod

        scenarios = perf_mod.summary(tables["perf_requests"], tables["perf_levels"])
        out += ["", "## Performance scenarios (client-side timestamps, streaming)", _table(scenarios, SCENARIO_COLUMNS)]
    if tables["smoke"].height:
        out += ["", "## Smoke checks", _table(tables["smoke"], SMOKE_COLUMNS)]
    extra = measured.gate_frames()
    if measured.logits is not None:
        out += [
            "",
            "## Full-distribution probe (full vocabulary, vs reference)",
            _table(measured.logits, LOGITS_COLUMNS),
        ]
    if measured.layer_curve is not None:
        title = "## Layer-wise probe (error growth across depth, vs reference)"
        out += ["", title, _table(measured.layer_curve, LAYER_COLUMNS)]
    gates = gate_mod.from_info(info) if gates is None else gates
    passed, verdicts = None, None
    if gates:
        verdicts = gate_mod.evaluate(
            gates,
            parity,
            perf,
            run_dir=run_dir,
            reference=reference,
            expected=gate_mod.expected_pairs(info),
            extra=extra,
        )
        passed = gate_mod.passed(verdicts)
    variants = (info.get("manifest_resolved") or {}).get("variants") or {}
    if variants:
        out += _matrix_section(info, requests, perf, verdicts, variants)
    if verdicts is not None:
        out += ["", f"## Gates: {'PASS' if passed else 'FAIL'}", gate_mod.render(verdicts)]
    return Summary("\n".join(out), info.get("status") == "complete", passed)


@dataclass(frozen=True)
class Measured:
    """Metrics beyond parity and throughput that gates can check: task accuracy and the probes."""

    accuracy: pl.DataFrame
    logits: pl.DataFrame | None  # probes.logits_summary
    layer_curve: pl.DataFrame | None  # probes.layer_curve: the error-growth curve

    @classmethod
    def of(cls, tables: dict[str, pl.DataFrame], reference: str) -> Measured:
        from fleet.analysis import probes

        logits = layers = None
        if tables["logits"].height:
            logits = probes.logits_summary(probes.logits_errors(tables["logits"], reference))
        if tables["layers"].height:
            layers = probes.layer_curve(probes.layer_errors(tables["layers"], reference))
        return cls(analysis.accuracy(tables["requests"], reference), logits, layers)

    def gate_frames(self) -> list[pl.DataFrame]:
        """Frames keyed by model/target with the metric columns gates.METRICS names."""
        from fleet.analysis import probes

        frames = [self.accuracy.select("model", "target", task_accuracy_delta="delta_points")]
        if self.logits is not None:
            frames.append(self.logits)
        if self.layer_curve is not None:
            frames.append(probes.layer_summary(self.layer_curve))
        return frames


def _matrix_section(
    info: dict[str, Any],
    requests: pl.DataFrame,
    perf: pl.DataFrame,
    verdicts: pl.DataFrame | None,
    variants: dict[str, dict[str, Any]],
) -> list[str]:
    """The feature matrix: per variant, did it start, did it pass its gates, its throughput; and
    greedy self-consistency between variants that differ in one setting."""

    failures = info.get("failures") or {}
    rows = []
    for model in sorted({k.split("/")[0] for k in info.get("provenance") or {}} | set(requests["model"].unique())):
        for name, variant in variants.items():
            key = f"{model}/{name}"
            mine = (
                verdicts.filter((pl.col("model") == model) & (pl.col("target") == name))
                if verdicts is not None
                else None
            )
            tok_s = perf.filter((pl.col("model") == model) & (pl.col("target") == name))["output_tok_s"]
            rows.append(
                {
                    "model": model,
                    "variant": name,
                    "settings": ", ".join(f"{k}={v}" for k, v in variant["settings"].items()),
                    "started": key in (info.get("provenance") or {}) and key not in failures,
                    "gates": "n/a"
                    if mine is None or not mine.height
                    else ("PASS" if gate_mod.passed(mine) else "FAIL"),
                    "out tok/s": tok_s[0] if tok_s.len() else None,
                    "failure": failures.get(key),
                }
            )
    pairs = consistency.self_consistency(
        requests,
        {n: v["base"] for n, v in variants.items()},
        settings={n: v["settings"] for n, v in variants.items()},
    )
    return [
        "",
        "## Feature matrix",
        _table(pl.DataFrame(rows), {c: c for c in rows[0]} if rows else {}),
        "",
        "Greedy self-consistency between variants differing in one setting (must be identical):",
        _table(pairs, {c: c for c in pairs.columns}),
    ]


def _g(value: float | None, *, scale: float = 1.0) -> str:
    return "n/a" if value is None else f"{scale * value:.4g}"


def _first_step_totals(parity: pl.DataFrame) -> list[str]:
    """The report's summary lines under the first-step table: means and the top-1 count."""
    return [
        f"{r['model']} / {r['target']}: mean |diff| {_g(r['first_logprob_diff_mean'])}, "
        f"mean rel err {_g(r['first_prob_rel_err_mean'], scale=100)}%, "
        f"top-1 agreement {round(r['first_top1_agreement'] * r['n_prompts'])}/{r['n_prompts']}"
        for r in parity.iter_rows(named=True)
    ]


def _sequence_totals(parity: pl.DataFrame) -> list[str]:
    """Sequence and token match with their counts, and r / MAE over the matched tokens."""
    out = []
    for r in parity.iter_rows(named=True):
        seqs = round(r["seq_match_rate"] * r["n_prompts"])
        out.append(
            f"{r['model']} / {r['target']}: sequence match {seqs}/{r['n_prompts']} "
            f"({100 * r['seq_match_rate']:.1f}%), token match {r['tokens_matched']}/{r['tokens_total']} "
            f"({100 * r['token_match_rate']:.1f}%), "
            f"matched-token logprob r = {_g(r['pearson_r'])}, MAE = {_g(r['mae'])}"
        )
    return out


def _notices(info: dict[str, Any], requests: pl.DataFrame) -> list[str]:
    """Lines a reader must not miss: failures, retries, test doubles, mixed weights."""
    out = [f"FAILED {key}: {reason}" for key, reason in (info.get("failures") or {}).items()]
    out += [f"FAILED shard {shard}: {reason}" for shard, reason in (info.get("failed_shards") or {}).items()]
    if info.get("retries"):
        out.append(f"retried calls: {info['retries']} (faults survived; rows are written once per shard)")
    doubles = [k for k, p in (info.get("provenance") or {}).items() if p.get("device") == "test-double"]
    if doubles:
        out.append(f"TEST DOUBLE targets (no model ran; figures are meaningless): {', '.join(doubles)}")
    weights = requests.group_by("model").agg(pl.col("model_weights").unique())
    for model, digests in weights.iter_rows():
        if len(digests) > 1:  # every target of a model must have loaded the same bytes
            out.append(f"WARNING {model}: targets loaded different weights {sorted(digests)}")
    return out
