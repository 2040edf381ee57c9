"""The standard report sections, registered in the order the text summary prints them
(fleet.report.blocks holds the registry). Each is its key, title, Markdown chapter, columns
(fleet.report.columns) and a build function over the RunReport; the figures come from
fleet.analysis, the lines written from them under a table from fleet.report.parity_lines and
fleet.report.perf_lines, and the notes that say how to read a table are here.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from fleet.analysis import consistency, workload
from fleet.report import columns, drilldown
from fleet.report.blocks import SECTIONS, Block, Section, SectionSpec, Table, register
from fleet.report.model import NO_VERDICT, RunReport
from fleet.report.parity_lines import (
    cut_note,
    first_step_totals,
    noise_floor_lines,
    precision_lines,
    sequence_totals,
    setting_effect_lines,
    weights_lines,
)
from fleet.report.perf_lines import client_bound, conditions

EVIDENCE = "Evidence: each check's value recomputed from the run's tables (a Polars expression)"
ACCURACY, PERFORMANCE = "Accuracy", "Performance"  # Markdown chapters


@register("parity", "Parity vs reference (TF = teacher-forced on the candidate's tokens)", chapter=ACCURACY,
          columns=columns.PARITY)  # fmt: skip
def _parity(r: RunReport, spec: SectionSpec) -> list[Block]:
    blocks = spec.table(r.parity)
    return [*blocks, precision_lines(r.parity)] if blocks and "tf_excess" in r.parity.columns else blocks


@register("first_step", "First step per prompt", chapter=ACCURACY, columns=columns.FIRST_STEP)
def _first_step(r: RunReport, spec: SectionSpec) -> list[Block]:
    blocks = spec.table(r.first_step, worst=("rel_err", True))
    if not blocks:
        return []
    return [*blocks, first_step_totals(r.parity), *cut_note(r, "first_step", "ORDER BY rel_err DESC")]


@register("sequences", "Full sequences (greedy)", chapter=ACCURACY, columns=columns.SEQUENCES)
def _sequences(r: RunReport, spec: SectionSpec) -> list[Block]:
    wrap = ("ref_text", "cand_text", "prompt")
    blocks = spec.table(r.sequences, worst=("first_divergence", False), wrap=wrap, detail=columns.SEQUENCES_DETAIL)
    if not blocks:
        return []
    return [*blocks, sequence_totals(r.parity), *cut_note(r, "divergences", "ORDER BY kind, first_divergence")]


@register("accuracy", "Task accuracy (prompts with an expected answer)", chapter=ACCURACY, columns=columns.ACCURACY)
def _accuracy(r: RunReport, spec: SectionSpec) -> list[Block]:
    return spec.table(r.accuracy)


@register("throughput", "Throughput and latency per target (parity runs, engine-side timestamps)",
          chapter=PERFORMANCE, columns=columns.THROUGHPUT)  # fmt: skip
def _throughput(r: RunReport, spec: SectionSpec) -> list[Block]:
    return spec.table(r.throughput)


@register("scenarios", "Performance scenarios (client-side timestamps, streaming)", chapter=PERFORMANCE,
          columns=columns.SCENARIOS)  # fmt: skip
def _scenarios(r: RunReport, spec: SectionSpec) -> list[Block]:
    blocks = spec.table(r.scenarios)
    return [*blocks, conditions(r.info), *client_bound(r.scenarios)] if blocks else []


@register("sweeps", "Rate sweeps: the highest request rate meeting the SLO", chapter=PERFORMANCE,
          columns=columns.SWEEPS)  # fmt: skip
def _sweeps(r: RunReport, spec: SectionSpec) -> list[Block]:
    blocks = spec.table(r.sweeps)
    if not blocks or r.sweeps is None:
        return []
    best = r.sweeps.group_by("model", "target", "scenario", "level", maintain_order=True).agg(
        pl.col("best_rps").first()
    )
    lines = [
        f"{row['target']} / {row['scenario']} @ {row['level']}: "
        + ("no probed rate met the SLO" if row["best_rps"] is None else f"{row['best_rps']:.4g} req/s")
        for row in best.iter_rows(named=True)
    ]
    note = (
        "Probe 0 is a closed loop at the level (offered = served: the most the target serves), then the floor, "
        "then bisection; a rate meets the SLO when its share of requests meeting it reaches the scenario's "
        "min_share. Highest passing rate per level: "
    )
    return [*blocks, note + "; ".join(lines)]


@register("load_parity", "Parity vs load (the parity prompts mid-load at each level, vs reference and vs alone)",
          chapter=PERFORMANCE, columns=columns.LOAD_PARITY)  # fmt: skip
def _load_parity(r: RunReport, spec: SectionSpec) -> list[Block]:
    blocks = spec.table(r.load_parity, worst=("real_divergences", True))
    if not blocks:
        return []
    note = (
        "Each level's parity prompts were sent alone first (c=1), then all at once mid-load, greedy, and "
        "teacher-forced by the reference; real divergences and near ties by the parity tables' rule and noise. "
        "'vs c=1': load minus alone; 'paths changed vs c=1': load outputs that differ from the same prompts "
        "alone, 'real div. from c=1' of which beyond the noise (the batch changed the answer)."
    )
    return [*blocks, note]


@register("workloads", "Token counts asked and seen, and prefix-cache hits, per level", chapter=PERFORMANCE,
          columns=columns.WORKLOADS)  # fmt: skip
def _workloads(r: RunReport, spec: SectionSpec) -> list[Block]:
    if not r.tables["perf_levels"].height:
        return []
    table = workload.lengths(r.tables["perf_requests"], r.tables["perf_levels"])
    flags = workload.length_flags(table)
    if not flags and table["length_miss_max"].is_not_null().any():
        flags = ["Every request's token counts are within 1 of what it asked for."]
    note = "prefix-cache hits: tokens found cached / looked up (the engine's counters); blank: it reports none"
    return [*spec.table(table), *flags, note]


@register("smoke", "Smoke checks", chapter=PERFORMANCE, columns=columns.SMOKE)
def _smoke(r: RunReport, spec: SectionSpec) -> list[Block]:
    return spec.table(r.smoke)


@register("logits", "Full-distribution probe (full vocabulary, vs reference)", chapter=ACCURACY,
          columns=columns.LOGITS)  # fmt: skip
def _logits(r: RunReport, spec: SectionSpec) -> list[Block]:
    return spec.table(r.logits)


@register("layers", "Layer-wise probe (error growth across depth, vs reference)", chapter=ACCURACY,
          columns=columns.LAYERS)  # fmt: skip
def _layers(r: RunReport, spec: SectionSpec) -> list[Block]:
    return spec.table(r.layers)


DRILLDOWN = {"model": "model", "diverging": "diverging", "prompt_id": "prompt", "step": "token", "target": "probed"}
DRILLDOWN |= {"where": "first past precision", "rel_l2": "rel L2 there", "twin_rel_l2": "twin's", "config": "msprobe"}
DRILL_CURVE = {"diverging": "diverging", "prompt_id": "prompt", "step": "token", "target": "probed", "layer": "layer"}
DRILL_CURVE |= {"kind": "part", "rel_l2": "rel L2", "twin_rel_l2": "twin rel L2", "ratio": "x twin", "exceeds": "past"}


@register("drilldown", "Drill-down: the layer where each real divergence starts", chapter=ACCURACY,
          columns=DRILLDOWN)  # fmt: skip
def _drilldown(r: RunReport, spec: SectionSpec) -> list[Block]:
    """Per real divergence, the first layer (and part of it) whose error vs the reference exceeds the
    precision twin's by the margin, and the error-growth curve it was read from."""
    table = r.tables.get("drilldown")
    curve, first = drilldown.view(table, r.info)
    if first.is_empty():
        if table is None or table.is_empty():
            return []
        diverging = ", ".join(sorted(set(table["diverging"])))
        return [
            f"Real divergences of {diverging} were probed on the reference and its precision twin only: no hf "
            "candidate gives hidden states to compare. Add an hf target of the candidate's dtype on its device "
            "(HF on the same card) to find the layer (docs/metrics.md#drill-down)."
        ]
    note = (
        f"Layer probe at each real divergence's prefix (prompt + shared output), last position; a part is past "
        f"precision when its rel L2 vs the reference exceeds {drilldown.margin(r.info):g} x the precision twin's "
        "(docs/metrics.md#drill-down). msprobe: a ready config.json in the run directory for that engine step and "
        "layer range; on vllm-ascend: vllm serve MODEL --enforce-eager --additional-config "
        '\'{"dump_config": "RUN_DIR/CONFIG"}\', then send the prompt alone.'
    )
    return [
        *spec.table(first),
        first["finding"].to_list(),
        note,
        Table(
            curve,
            DRILL_CURVE,
            title="Error growth across depth (embeddings, per layer: attention, MLP, output; final norm)",
            fold=True,
        ),
    ]


@register("matrix", "Feature matrix", chapter=ACCURACY, columns=columns.MATRIX)
def _matrix(r: RunReport, spec: SectionSpec) -> list[Block]:
    if r.matrix is None:
        return []
    pairs = r.consistency if r.consistency is not None and r.consistency.height else None
    return [
        *spec.table(r.matrix),
        "Greedy self-consistency between variants differing in one setting: where two outputs part, a "
        "near tie when the reference's margin between the two tokens is within the noise (as in the parity "
        "table), else a real divergence; the gate metric consistency_real_divergences counts them per variant:",
        Table(pairs, columns.CONSISTENCY) if pairs is not None else "no two variants differ in exactly one setting",
    ]


EFFECTS = {"model": "model", "setting": "setting", "target_a": "variant a", "target_b": "variant b"}
EFFECTS |= {"delta_tf_p99": "Δ TF p99 |dlogp| (b - a)", "noise": "noise (nats)", "effect_x_noise": "|Δ| x noise"}
EFFECTS |= {"delta_real_divergences": "Δ real div. vs ref", "paths_changed": "paths changed a vs b"}
EFFECTS |= {"n_prompts": "prompts", "effect": "effect"}


@register("setting_effects", "Which setting moves the outputs (one factor at a time)", chapter=ACCURACY,
          columns=EFFECTS)  # fmt: skip
def _setting_effects(r: RunReport, spec: SectionSpec) -> list[Block]:
    """Each matrix setting's effect against the noise: what parity would call precision or a bug."""
    if r.consistency is None or r.consistency.is_empty():
        return []
    effects = consistency.effects(r.consistency, r.parity)
    if effects.is_empty():
        return []
    return [*spec.table(effects), setting_effect_lines(effects)]


@register("noise_floor", "Noise floor (each repeated target against itself)", chapter=ACCURACY,
          columns=columns.NOISE_FLOOR)  # fmt: skip
def _noise_floor(r: RunReport, spec: SectionSpec) -> list[Block]:
    """The floor, and what it says about each candidate's distance from the reference."""
    if r.noise_floor is None or r.noise_floor.is_empty():
        return []
    return [*spec.table(r.noise_floor), noise_floor_lines(r.noise_floor, r.parity)]


def _architecture(model: str, arch: dict[str, Any]) -> Block:
    if not arch:
        return f"{model}: config.json not readable from here."
    values = [", ".join(map(str, v)) if isinstance(v, list) else str(v) for v in arch.values()]
    frame = pl.DataFrame({"config": list(arch), "value": values}, schema={"config": pl.String, "value": pl.String})
    return Table(frame, columns.ARCHITECTURE, title=model)


@register("environment", "Environment and provenance", chapter="environment")
def _environment(r: RunReport, spec: SectionSpec) -> list[Block]:
    blocks = spec.table(r.environment if len(r.environment.columns) > 1 else None)
    return blocks + weights_lines(r.info, r.reference) if blocks else []


@register("architecture", "Model architecture", chapter="architecture", columns=columns.ARCHITECTURE)
def _architectures(r: RunReport, spec: SectionSpec) -> list[Block]:
    return [_architecture(model, arch) for model, arch in r.architecture.items()]


@register("gates", "Gates", chapter="Conclusion", columns=columns.VERDICTS, absent=NO_VERDICT)
def _gates(r: RunReport, spec: SectionSpec) -> list[Block]:
    if r.verdicts is None:
        return []
    verdicts = r.verdicts.sort(pl.col("verdict") != "FAIL", "model", "target", "gate", maintain_order=True)
    # The evidence (a Polars expression per check) is as long as the rest of the row: a table of its own.
    evidence = Table(verdicts, columns.EVIDENCE, title=EVIDENCE, code=("evidence",), fold=True)
    return [r.verdict_line, *spec.table(verdicts), evidence]


def sections(report: RunReport, *, standard: bool = True) -> dict[str, Section]:
    """Every standard section built for `report`, by key, in registration order (the text
    summary's); `standard=False`: every registered section, those only layouts place included."""
    out = {key: spec.section(report) for key, spec in SECTIONS.items() if spec.standard or not standard}
    if "gates" in out and report.verdicts is not None:  # the verdict in the title: a reader scanning headings
        gates = out["gates"]
        out["gates"] = Section(gates.key, f"{gates.title}: {'PASS' if report.gates_passed else 'FAIL'}", gates.blocks)
    return out
