"""The standard report sections, registered in the order the text summary prints them
(fleet.report.blocks holds the registry). Each is its key, title, Markdown chapter, columns
(fleet.report.columns) and a build function over the RunReport; the figures come from
fleet.analysis, the sentences around them are here.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from fleet.analysis import consistency, perf, workload
from fleet.report import columns, drilldown
from fleet.report.blocks import SECTIONS, Block, Section, SectionSpec, Table, register
from fleet.report.model import NO_VERDICT, RunReport
from fleet.results.info import RunInfo

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
    lines = []
    for (model, setting), group in effects.group_by("model", "setting", maintain_order=True):
        worst = group.sort("effect_x_noise", descending=True, nulls_last=True).row(0, named=True)
        changed, prompts = int(group["paths_changed"].fill_null(0).sum()), int(group["n_prompts"].sum())
        above = (group["effect"] == "above noise").any()
        lines.append(
            f"{model} / {setting}: TF p99 moves by {_g(worst['delta_tf_p99'])} nats at most "
            f"({_g(worst['effect_x_noise'])}x the noise {_g(worst['noise'])}); {changed} of {prompts} greedy paths "
            f"change beyond the noise over {group.height} pairs: {'above' if above else 'within'} noise"
        )
    return [*spec.table(effects), lines]


@register("noise_floor", "Noise floor (each repeated target against itself)", chapter=ACCURACY,
          columns=columns.NOISE_FLOOR)  # fmt: skip
def _noise_floor(r: RunReport, spec: SectionSpec) -> list[Block]:
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
    return [*spec.table(r.noise_floor), lines]


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


def conditions(info: RunInfo) -> list[str]:
    """Each perf scenario's test conditions, and which targets loaded dummy weights (their speed is
    a real figure, their outputs are not)."""
    out = [
        f"{s['name']}: {s['num_requests']} requests per level at concurrency {s['concurrency']}, "
        + _prompts(s)
        + f", {_count(s['output_tokens'])} output tokens "
        + ("(ignore_eos)" if s.get("ignore_eos", True) else "(at most: free output)")
        + f", warm-up {s['warmup_requests']}, "
        + _arrivals(s)
        for s in info.perf
    ]
    dummies = [t["name"] for t in info.targets if (t.get("engine_args") or {}).get("load_format") == "dummy"]
    return out + ([f"dummy-weight targets (load_format: dummy): {', '.join(dummies)}"] if dummies else [])


def _prompts(s: dict[str, Any]) -> str:
    """What a scenario's prompts were: their source, their structure and how they were sent."""
    if s.get("trace"):
        return f"trace {s['trace']} replayed at its own times (sent as {s.get('send', 'ids')})"
    if not s.get("input_tokens"):
        return f"prompts of set {s['prompt_set']}"
    text = f"{_count(s['input_tokens'])} input tokens"
    if prefix := s.get("shared_prefix"):
        text += f" after a shared prefix of {prefix['prefix_tokens']} ({prefix['groups']} groups)"
    if turns := s.get("multi_turn"):
        text += f" per turn, {turns['turns']}-turn conversations re-sending their history"
    sent = {"ids": "", "text": ", sent as text", "chat": ", sent as chat (counted after the chat template)"}
    return text + sent[s.get("send", "ids")]


def _count(value: int | dict[str, Any]) -> str:
    """A token count or its distribution, as the manifest gave it."""
    if isinstance(value, int):
        return str(value)
    if value["distribution"] == "fixed":
        return str(value["mean"])
    if value["distribution"] == "uniform":
        return f"uniform {value['min']}-{value['max']}"
    return f"normal({value['mean']}, {value['std']:g}) in {value['min']}-{value['max']}"


def _arrivals(scenario: dict[str, Any]) -> str:
    if scenario.get("trace"):
        clients = f", {scenario['clients']} client processes" if (scenario.get("clients") or 1) > 1 else ""
        return f"arrivals at the trace's times{clients}"
    rate, shape, ramp, sweep = (scenario.get(k) for k in ("request_rate", "burstiness", "ramp", "sweep"))
    gaps = "evenly spaced" if scenario.get("arrival") == "constant" else (
        "Poisson" if shape in (None, 1) else f"gamma gaps of burstiness {shape:g}"
    )  # fmt: skip
    clients = f", {scenario['clients']} client processes" if (scenario.get("clients") or 1) > 1 else ""
    if sweep:
        return f"a sweep from {sweep['floor_rps']:g}/s to the closed loop's rate, {gaps}{clients}"
    if ramp:
        how = f"{ramp['strategy']} ramp from {ramp['start_rps']:g}/s to {ramp['end_rps']:g}/s"
        return f"arrivals on a {how}, {gaps}{clients}"
    if rate is None:
        return f"closed loop{clients}"
    return f"arrivals at {rate:g}/s, {gaps}{clients}"


def client_bound(scenarios: pl.DataFrame | None) -> list[Block]:
    """A warning naming the levels whose client may have set the pace (fleet/analysis/perf.py's rule)."""
    if scenarios is None or "client_bound" not in scenarios.columns:
        return []
    flagged = scenarios.filter(pl.col("client_bound").fill_null(False))
    if flagged.is_empty():
        return []
    where = ", ".join(f"{t} / {s} @ {lv}" for t, s, lv in flagged.select("target", "scenario", "level").iter_rows())
    return [
        f"Client-bound (send lag p99 > {perf.CLIENT_LAG_S * 1000:g} ms or client CPU > "
        f"{perf.CLIENT_CPU_SHARE:.0%} of a core): {where}. These figures may measure the load generator, not "
        "the target: spread the load over more client processes (the scenario's clients) or nodes."
    ]


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


def weights_lines(info: RunInfo, reference: str | None) -> list[Block]:
    """Targets that loaded other weights than the reference did for the same model (a calibrate
    mutant's weight_noise, a different checkpoint behind one name): their parity is not a port's."""
    prov = info.provenance
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
