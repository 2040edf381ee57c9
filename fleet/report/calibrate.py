"""`fleet calibrate MANIFEST`: do the manifest's gates catch a broken port, and stay quiet on a sound one?

Two runs of the manifest, its perf scenarios, probes and drill-down left out:
1. **healthy**: every `vllm` candidate as written, `repeat: N` times (N healthy verdicts each, in
   actors of their own): any gate FAIL there is a false alarm;
2. **mutants**: the reference plus, for every `vllm` candidate, copies whose model config is changed
   the way ports go wrong, through vLLM's own `hf_overrides` (MUTATIONS: the RMSNorm epsilon, the
   rope base, the logit scale, the activation), relative to the values in the model's config.json
   as the healthy run loaded it, and copies that load seeded noise in their weights.
The power table says, per mutant, how far it moved the logprobs (its TF p99 |dlogp| and its excess
over the noise model, fleet/analysis/noise_model.py), and which gates caught it; per family, the
smallest change caught. The goal it checks: in float32 every mutant beyond 10x float32's noise
fails, in 16-bit every mutant whose excess interval lies above 1 fails, and no healthy copy fails.
A reference whose next-token distributions are nearly flat (mean first-token probability under
FLAT_P) moves too little under any mutation to test anything: the table says so.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from fleet.contracts.errors import UserError
from fleet.contracts.inputs import load_yaml, read_text
from fleet.contracts.messages import unknown
from fleet.report.model import RunReport
from fleet.report.provenance import architecture
from fleet.results import reader
from fleet.results.info import RunInfo
from fleet.run import driver
from fleet.run.cluster import ray_cluster
from fleet.run.idle_actors import across_runs

FLAT_P = 0.01  # a flat model (default-init synthetic llama) is ~0.004; init_std 0.1 gives ~0.03

# family -> [(label, relative size, config.json -> the target's changed fields, None where it does
# not apply)]; sizes as fractions of the healthy value, for "the smallest change caught".
Mutation = tuple[str, float, Callable[[dict[str, Any]], dict[str, Any] | None]]


def _override(change: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if change is None else {"hf_overrides": change}


def _eps(factor: float) -> Mutation:
    return f"rms_norm_eps x{factor:g}", factor - 1, lambda c: _override(_scaled(c, "rms_norm_eps", factor))


def _rope(factor: float) -> Mutation:
    return f"rope base x{factor:g}", abs(factor - 1), lambda c: _override(_rope_base(c, factor))


def _logit_scale(factor: float) -> Mutation:
    # vLLM's llama multiplies its logits by config.logit_scale (Cohere's; Granite's logits_scaling
    # is the same idea): a port that misses or doubles such a factor keeps every greedy token.
    scaled = lambda c: _override({"logit_scale": c.get("logit_scale", 1) * factor})  # noqa: E731
    return f"logit scale x{factor:g}", factor - 1, scaled


def _act(c: dict[str, Any]) -> dict[str, Any] | None:
    act = c.get("hidden_act")
    return None if act is None else _override({"hidden_act": "gelu" if act == "silu" else "silu"})


def _noise(relative: float) -> Mutation:
    # Not in the config: a noisy copy of the checkpoint (actors/weight_noise.py), seeded.
    return f"weight noise {relative:g}", relative, lambda c: {"weight_noise": {"seed": 0, "relative": relative}}


MUTATIONS: dict[str, list[Mutation]] = {
    "norm epsilon": [_eps(10), _eps(100)],
    "rope base": [_rope(1.01), _rope(1.05), _rope(0.8)],
    "logit scale": [_logit_scale(1.01), _logit_scale(1.05)],
    "activation": [("activation swapped", 1.0, _act)],
    "weights": [_noise(1e-4), _noise(1e-3), _noise(1e-2), _noise(5e-2)],
}


def _scaled(config: dict[str, Any], key: str, factor: float) -> dict[str, Any] | None:
    return None if config.get(key) is None else {key: config[key] * factor}


def _rope_base(config: dict[str, Any], factor: float) -> dict[str, Any] | None:
    params = config.get("rope_parameters")  # transformers 5 keeps the base here
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        return {"rope_parameters": params | {"rope_theta": params["rope_theta"] * factor}}
    return _scaled(config, "rope_theta", factor)


def calibrate(
    manifest_path: Path,
    *,
    results_dir: str | Path,
    run_id: str,
    repeats: int,
    overrides: Sequence[str] = (),
    mutations: Sequence[str] = (),
    healthy_dir: str | Path | None = None,
    mutants_dir: str | Path | None = None,
) -> tuple[pl.DataFrame, list[str]]:
    """Run both runs (each only when its finished run directory is not given: the table is then
    recomputed from stored rows, e.g. with changed gates); return the power table and its summary
    lines (the goal, the flat-model warning). `mutations`: only these (labels, or their dashed form
    as in target names); all when empty."""
    chosen = _chosen(mutations)
    raw = load_yaml(read_text(manifest_path, what="manifest"), source=str(manifest_path))
    reference = raw.get("reference") if isinstance(raw, dict) else None
    targets = [t for t in raw.get("targets") or [] if isinstance(t, dict)] if isinstance(raw, dict) else []
    candidates = [t for t in targets if t.get("kind") == "vllm" and t.get("name") != reference]
    if not candidates:
        msg = f"{manifest_path}: calibrate mutates vllm targets, and this manifest's candidates include none"
        raise UserError(msg)
    cut = [*overrides, "perf=[]", "probes={}", "drilldown=false"]
    healthy = [{k: v for k, v in t.items() if k not in ("after", "matrix")} | {"repeat": repeats} for t in candidates]
    ref_target = [t for t in targets if t.get("name") == reference]
    with contextlib.ExitStack() as runs:
        if healthy_dir is None or mutants_dir is None:
            # One Ray for both runs, and the mutants built in the healthy run's actor processes.
            runs.enter_context(ray_cluster(None, verbose=False))
            runs.enter_context(across_runs())
        if healthy_dir is None:
            healthy_dir, _ = driver.run(
                manifest_path, results_dir=results_dir, run_id=f"{run_id}-healthy", progress=False,
                overrides=[*cut, f"targets={json.dumps(ref_target + healthy)}"],
            )  # fmt: skip
        info = reader.read_info(healthy_dir)
        if not info.complete:
            msg = f"{healthy_dir}: the healthy run is {info.status!r}, not complete: run it again"
            raise UserError(msg)
        models = info.model_names
        config = _config(info, models[0])  # the mutants are built from the first model's config
        mutants, meta = [], {}
        for cand in candidates:
            for family, family_mutations in MUTATIONS.items():
                for label, size, make in family_mutations:
                    change = make(config)
                    if change is None or label not in chosen:
                        continue
                    name = f"{cand['name']}.mutant-{label.replace(' ', '-')}"
                    engine_args = dict(cand.get("engine_args") or {})
                    if "hf_overrides" in change:
                        overrides = dict(engine_args.get("hf_overrides") or {}) | change.pop("hf_overrides")
                        engine_args["hf_overrides"] = overrides
                    keep = {
                        k: v for k, v in cand.items() if k not in ("after", "matrix", "repeat", "name", "engine_args")
                    }
                    mutants.append(keep | change | {"name": name, "engine_args": engine_args})
                    meta[name] = {"candidate": cand["name"], "family": family, "mutation": label, "size": size}
        if mutants_dir is None:
            mutants_dir, _ = driver.run(
                manifest_path, results_dir=results_dir, run_id=f"{run_id}-mutants", progress=False,
                overrides=[*cut, f"targets={json.dumps(ref_target + mutants)}"],
            )  # fmt: skip
    mutant_dir = mutants_dir
    gates = _gates(raw, meta)
    table = pl.concat([_rows(healthy_dir, gates, None), _rows(mutant_dir, gates, meta)], how="diagonal_relaxed")
    lines = summary(table, reference_top1_p(RunReport.build(healthy_dir, gates=[])), gates=[g.label for g in gates])
    return table, lines


def _chosen(asked: Sequence[str]) -> set[str]:
    labels = {label: label for family in MUTATIONS.values() for label, _, _ in family}
    labels |= {label.replace(" ", "-"): label for label in list(labels)}
    for name in asked:
        if name not in labels:
            raise UserError(unknown("mutation", name, [k for k in labels if " " in k]))
    return {labels[name] for name in asked} if asked else set(labels.values())


def _config(info: RunInfo, model: str) -> dict[str, Any]:
    arch = architecture(info, model)
    path = Path(arch.get("model_dir") or "/nonexistent") / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _gates(raw: dict[str, Any], meta: dict[str, dict[str, Any]]) -> list[Any]:
    """The manifest's gates, a gate naming a candidate also naming its mutants."""
    from fleet.analysis.gates import parse

    out = []
    for g in parse(raw.get("gates") or [], source="gates"):
        if g.targets:
            extra = [m for m, d in meta.items() if d["candidate"] in g.targets]
            g = g.model_copy(update={"targets": [*g.targets, *extra]})
        out.append(g)
    if not out:
        msg = "calibrate measures the manifest's gates, and it has none"
        raise UserError(msg)
    return out


def _rows(run_dir: str | Path, gates: list[Any], meta: dict[str, dict[str, Any]] | None) -> pl.DataFrame:
    report = RunReport.build(run_dir, gates=gates)
    verdicts = report.verdicts if report.verdicts is not None else pl.DataFrame()
    rows = []
    for r in report.parity.iter_rows(named=True):
        mine = verdicts.filter(pl.col("target") == r["target"]) if verdicts.height else verdicts
        failed = sorted(mine.filter(pl.col("verdict") == "FAIL")["gate"].to_list()) if mine.height else []
        m = (meta or {}).get(r["target"], {})
        rows.append(
            {
                "target": r["target"],
                "started": True,
                "candidate": m.get("candidate", r["target"].split(".repeat-")[0]),
                "mutation": m.get("mutation", "none (healthy)"),
                "family": m.get("family"),
                "size": m.get("size"),
                "dtype": report.info.targets[_index(report.info, r["target"])].get("dtype"),
                "tf_p99_abs_logprob_diff": r.get("tf_p99_abs_logprob_diff"),
                "noise": r.get("noise"),
                "tf_excess": r.get("tf_excess"),
                "tf_excess_ci_low": r.get("tf_excess_ci_low"),
                "caught": bool(failed),
                "failed_gates": ", ".join(failed) or "-",
            }
        )
    failures = report.info.failures
    for target, m in (meta or {}).items():  # a mutant vLLM refuses to load is no port it could ship
        reason = next((why for key, why in failures.items() if key.split("/", 1)[1] == target), None)
        if reason is not None and target not in {r["target"] for r in rows}:
            rows.append(
                {"target": target, "started": False, "candidate": m["candidate"], "mutation": m["mutation"]}
                | {"family": m["family"], "size": m["size"], "caught": None, "failed_gates": f"did not start: {reason}"}
            )
    return pl.DataFrame(rows, infer_schema_length=None)


def _index(info: RunInfo, target: str) -> int:
    names = [t["name"] for t in info.targets]
    return names.index(target)


def summary(table: pl.DataFrame, p_top: float | None, gates: Sequence[str] = ()) -> list[str]:
    """The power table's conclusions; `p_top` is the reference's mean first-token probability,
    `gates` the labels of the gates measured (each gets a line: what it catches on its own)."""
    lines = []
    mutants, sound = table.filter(pl.col("family").is_not_null()), table.filter(pl.col("family").is_null())
    alarms = sound.filter(pl.col("caught"))
    lines.append(f"healthy: {sound.height - alarms.height}/{sound.height} copies passed every gate")
    for (cand, family), group in mutants.group_by("candidate", "family", maintain_order=True):
        ran = group.filter(pl.col("caught").is_not_null())
        caught = ran.filter(pl.col("caught")).sort("size")
        smallest = f"catches {caught['mutation'][0]} and more" if caught.height else "catches none"
        refused = group.height - ran.height
        lines.append(
            f"{cand}, {family}: {caught.height}/{ran.height} caught; {smallest}"
            + (f" ({refused} refused by vLLM at start, not counted)" if refused else "")
        )
    ran = mutants.filter(pl.col("caught").is_not_null())
    for gate in gates:
        mine = ran.filter(pl.col("failed_gates").str.split(", ").list.contains(gate))
        firsts = [g.sort("size")["mutation"][0] for _, g in mine.group_by("family", maintain_order=True)]
        what = f"smallest per family: {', '.join(firsts)}" if firsts else "catches none of them"
        lines.append(f"gate {gate}: fails on {mine.height}/{ran.height} mutants (all candidates); {what}")
    # float32: the noise is 10x the twin's (parity.allowance), so an excess above 1 is 10x float32's noise.
    must = (pl.col("dtype") == "float32") & (pl.col("tf_excess") > 1)
    must |= (pl.col("dtype") != "float32") & (pl.col("tf_excess_ci_low") > 1)
    missed = mutants.filter(must & (pl.col("caught") == False))  # noqa: E712  (null: did not start)
    goal = "holds" if missed.is_empty() and alarms.is_empty() else "MISSED"
    lines.append(f"goal {goal}: {missed.height} mutant(s) beyond precision passed, {alarms.height} false alarm(s)")
    if p_top is not None and p_top < FLAT_P:
        lines.append(
            f"these gates cannot tell a broken port on this model: the reference's mean first-token probability "
            f"is {p_top:.3g} (nearly flat; a synthetic model needs a larger init_std, e.g. 0.1)"
        )
    return lines


def reference_top1_p(report: RunReport) -> float | None:
    """The reference's mean probability of its own first token: how peaked its outputs are."""
    tokens = report.tokens.filter((pl.col("target") == report.reference) & (pl.col("position") == 0))
    value = tokens.select(pl.col("logprob").cast(pl.Float64).exp().mean()).collect().item()
    return None if value is None else float(value)
