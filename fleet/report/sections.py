"""A RunReport as titled sections of paragraphs, lists and tables: the content every format shows.

The text summary, the Markdown and the HTML report lay out the same sections (fleet.report.text,
.markdown, .html): each decides its order, its headings and how many rows of a long table fit,
none decides what is in a section. A section with no blocks was not measured on this run, and
every format says so rather than leaving the section out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleet.report import columns
from fleet.report.model import RunReport

NOT_MEASURED = "not measured on this run"
EVIDENCE = "Evidence: each check's value recomputed from the run's tables (a Polars expression)"
TITLES = {
    "parity": "Parity vs reference (TF = teacher-forced on the candidate's tokens)",
    "first_step": "First step per prompt",
    "sequences": "Full sequences (greedy)",
    "accuracy": "Task accuracy (prompts with an expected answer)",
    "throughput": "Throughput and latency per target (parity runs, engine-side timestamps)",
    "scenarios": "Performance scenarios (client-side timestamps, streaming)",
    "smoke": "Smoke checks",
    "logits": "Full-distribution probe (full vocabulary, vs reference)",
    "layers": "Layer-wise probe (error growth across depth, vs reference)",
    "matrix": "Feature matrix",
    "noise_floor": "Noise floor (each repeated target against itself)",
    "environment": "Environment and provenance",
    "architecture": "Model architecture",
    "gates": "Gates",
}


@dataclass(frozen=True)
class Table:
    frame: pl.DataFrame
    columns: Mapping[str, str]  # column -> header: which columns, in which order (fleet.report.columns)
    title: str = ""  # a sub-heading, e.g. the model of an architecture table
    worst: tuple[str, bool] | None = None  # (column, descending): the rows kept first when a format cuts
    code: tuple[str, ...] = ()  # columns holding code (the gates' evidence expressions)
    wrap: tuple[str, ...] = ()  # columns of free text, which the HTML wraps
    detail: Mapping[str, str] = field(default_factory=dict)  # more free-text columns, only where there is room
    fold: bool = False  # the HTML folds it (closed <details>): long content few readers need, e.g. code


Block = str | list[str] | Table  # a paragraph, a list of lines, a table


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    blocks: list[Block]  # empty: not measured
    absent: str = NOT_MEASURED  # what the section says when empty


def sections(report: RunReport) -> dict[str, Section]:
    """Every section of the report by key, in TITLES order (the text summary's)."""
    r = report
    blocks: dict[str, list[Block]] = {
        "parity": _table(r.parity, columns.PARITY),
        "first_step": _table(r.first_step, columns.FIRST_STEP, worst=("rel_err", True)),
        "sequences": _table(
            r.sequences,
            columns.SEQUENCES,
            worst=("first_divergence", False),
            wrap=("ref_text", "cand_text", "prompt"),
            detail=columns.SEQUENCES_DETAIL,
        ),
        "accuracy": _table(r.accuracy, columns.ACCURACY),
        "throughput": _table(r.throughput, columns.THROUGHPUT),
        "scenarios": _table(r.scenarios, columns.SCENARIOS),
        "smoke": _table(r.smoke, columns.SMOKE),
        "logits": _table(r.logits, columns.LOGITS),
        "layers": _table(r.layers, columns.LAYERS),
        "matrix": _matrix(r),
        "noise_floor": _noise_floor(r),
        "environment": _table(r.environment if len(r.environment.columns) > 1 else None, {}),
        "architecture": [_architecture(model, arch) for model, arch in r.architecture.items()],
        "gates": _gates(r),
    }
    if blocks["environment"]:
        blocks["environment"] += weights_lines(r.info, r.reference)
    if blocks["parity"] and "tf_excess" in r.parity.columns:
        blocks["parity"].append(precision_lines(r.parity))
    if blocks["first_step"]:
        blocks["first_step"].append(first_step_totals(r.parity))
        blocks["first_step"] += cut_note(r, "first_step", "ORDER BY rel_err DESC")
    if blocks["sequences"]:
        blocks["sequences"].append(sequence_totals(r.parity))
        blocks["sequences"] += cut_note(r, "divergences", "ORDER BY kind, first_divergence")
    out = {key: Section(key, TITLES[key], blocks[key]) for key in TITLES}
    if r.verdicts is None:
        out["gates"] = Section("gates", TITLES["gates"], [], absent=r.verdict_line)
    else:
        out["gates"] = Section("gates", f"{TITLES['gates']}: {'PASS' if r.gates_passed else 'FAIL'}", blocks["gates"])
    return out


def _table(frame: pl.DataFrame | None, cols: Mapping[str, str], **kwargs: Any) -> list[Block]:
    if frame is None or frame.is_empty():
        return []
    return [Table(frame, cols or {c: c for c in frame.columns}, **kwargs)]


def _matrix(r: RunReport) -> list[Block]:
    if r.matrix is None:
        return []
    pairs = r.consistency if r.consistency is not None and r.consistency.height else None
    return [
        Table(r.matrix, columns.MATRIX),
        "Greedy self-consistency between variants differing in one setting (must be identical):",
        Table(pairs, columns.CONSISTENCY) if pairs is not None else "no two variants differ in exactly one setting",
    ]


def _noise_floor(r: RunReport) -> list[Block]:
    """The floor, and what it says about each candidate's distance from the reference."""
    if r.noise_floor is None or r.noise_floor.is_empty():
        return []
    lines = []
    for row in r.noise_floor.iter_rows(named=True):
        floor = row["max_abs_logprob_diff"]
        vs_ref = r.parity.filter((pl.col("model") == row["model"]) & (pl.col("target") == row["target"]))
        to_ref = vs_ref["tf_max_abs_logprob_diff"].item() if vs_ref.height else None
        where = f"{row['model']} / {row['target']}"
        if floor is None:
            lines.append(f"{where}: no common prefix with its copy to compare.")
        elif floor == 0:
            lines.append(
                f"{where}: bit-identical to its rerun (floor 0 within this run on this machine); its distance "
                f"to the reference (TF max |dlogp| {_g(to_ref)}) is not run-to-run noise here. Another machine's "
                "kernels may still differ, which the near-tie rule allows for."
            )
        elif to_ref is not None and to_ref <= floor:
            lines.append(f"{where}: TF max |dlogp| to the reference {_g(to_ref)} is within its own noise {_g(floor)}.")
        else:
            lines.append(f"{where}: TF max |dlogp| to the reference {_g(to_ref)}; its own noise is {_g(floor)}.")
    return [Table(r.noise_floor, columns.NOISE_FLOOR), lines]


def _architecture(model: str, arch: dict[str, Any]) -> Block:
    if not arch:
        return f"{model}: config.json not readable from here."
    values = [", ".join(map(str, v)) if isinstance(v, list) else str(v) for v in arch.values()]
    frame = pl.DataFrame({"config": list(arch), "value": values}, schema={"config": pl.String, "value": pl.String})
    return Table(frame, columns.ARCHITECTURE, title=model)


def _gates(r: RunReport) -> list[Block]:
    if r.verdicts is None:
        return []
    verdicts = r.verdicts.sort(pl.col("verdict") != "FAIL", "model", "target", "gate", maintain_order=True)
    # The evidence (a Polars expression per check) is as long as the rest of the row: a table of its own.
    evidence = Table(verdicts, columns.EVIDENCE, title=EVIDENCE, code=("evidence",), fold=True)
    return [r.verdict_line, Table(verdicts, columns.VERDICTS), evidence]


def _g(value: float | None, *, scale: float = 1.0) -> str:
    return "n/a" if value is None else f"{scale * value:.4g}"


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f}%"


def cut_note(r: RunReport, table: str, order: str) -> list[Block]:
    """Where a per-prompt table shows only the worst prompts: how many, and the query for the rest."""
    cut = r.shown.filter(pl.col("n_shown") < pl.col("n_prompts"))
    if cut.is_empty():
        return []
    counts = ", ".join(f"{t}: {s} of {n}" for t, s, n in cut.select("target", "n_shown", "n_prompts").iter_rows())
    return [
        f"Showing the worst prompts per target ({counts}; `--top N` shows more). All of them: "
        f"`fleet query {r.run_dir} \"SELECT * FROM {table} WHERE target = '{cut['target'][0]}' {order}\"`"
    ]


def weights_lines(info: Mapping[str, Any], reference: str | None) -> list[Block]:
    """Targets that loaded other weights than the reference did for the same model (a calibrate
    mutant's weight_noise, a different checkpoint behind one name): their parity is not a port's."""
    prov = info.get("provenance") or {}
    lines = []
    for key, facts in prov.items():
        model, target = key.split("/", 1)
        ref = prov.get(f"{model}/{reference}", {}).get("weights_sha256")
        if target != reference and ref and facts.get("weights_sha256") not in (None, ref):
            lines.append(f"{key}: weights {facts['weights_sha256']}, not the reference's {ref}")
    return [["These targets loaded other weights than the reference:", *lines]] if lines else []


def first_step_totals(parity: pl.DataFrame) -> list[str]:
    """The summary lines under the first-step table: means and the top-1 count."""
    return [
        f"{r['model']} / {r['target']}: mean |diff| {_g(r['first_logprob_diff_mean'])}, "
        f"mean rel err {_g(r['first_prob_rel_err_mean'], scale=100)}%, "
        f"top-1 agreement {round((r['first_top1_agreement'] or 0) * r['n_prompts'])}/{r['n_prompts']}"
        for r in parity.iter_rows(named=True)
    ]


def precision_lines(parity: pl.DataFrame) -> list[str]:
    """Each candidate's error against the noise model's (fleet/analysis/noise_model.py): within
    precision, or beyond it by more than the bootstrap interval (a bug)."""
    out = []
    for r in parity.iter_rows(named=True):
        if r.get("tf_excess") is None:
            out.append(f"{r['model']} / {r['target']}: precision not measured ({r.get('noise_source') or 'no rows'})")
            continue
        out.append(
            f"{r['model']} / {r['target']}: TF p99 |dlogp| {_g(r['tf_p99_abs_logprob_diff'])} is "
            f"{r['tf_excess']:.2f}x the noise {_g(r['noise'])} nats ({r['noise_source']}), 95% CI "
            f"{r['tf_excess_ci_low']:.2f}-{r['tf_excess_ci_high']:.2f}: {r['precision_verdict']}"
        )
    return out


def sequence_totals(parity: pl.DataFrame) -> list[str]:
    """Sequence and token match with their counts, and r / MAE over the matched tokens."""
    out = []
    for r in parity.iter_rows(named=True):
        seqs = round(r["seq_match_rate"] * r["n_prompts"])
        out.append(
            f"{r['model']} / {r['target']}: sequence match {seqs}/{r['n_prompts']} "
            f"({_pct(r['seq_match_rate'])}), token match {r['tokens_matched']}/{r['tokens_total']} "
            f"({_pct(r['token_match_rate'])}), "
            f"matched-token logprob r = {_g(r['pearson_r'])}, MAE = {_g(r['mae'])}"
            + (
                f"; of {r['n_diverged']} divergences {r['near_ties']} near ties "
                f"(within the noise {_g(r.get('noise'))} nats)"
                if r.get("near_ties") is not None and r["n_diverged"]
                else ""
            )
        )
    return out
