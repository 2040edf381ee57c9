"""One run's report, computed once from its run directory: every figure the text summary, the
HTML and Markdown reports and `fleet compare` show.

`RunReport.build` reads the run (a local directory or a URI such as s3://bucket/prefix/run_id,
through fleet.results.reader) and computes, with fleet.analysis: parity, first step and full
sequences, task accuracy, parity-run throughput, perf-scenario levels, smoke checks, the logits
and layer probes, the feature matrix with its self-consistency, gate verdicts and the notices a
reader must not miss. A frame is None when the run did not measure it (no expected answers, no
perf scenario, no probe, no matrix); the renderers then say so. fleet.report.sections turns the
object into titled sections, which each format lays out.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from fleet.analysis import (
    consistency,
    divergence,
    from_stats,
    load_parity,
    noise_floor,
    noise_model,
    parity_resample,
    probes,
    stats_divergences,
    task_accuracy,
    throughput,
)
from fleet.analysis import gates as gate_mod
from fleet.analysis import parity as analysis
from fleet.analysis.baseline import RunBaselines
from fleet.analysis.noise_model import NoiseSpec
from fleet.analysis.perf import slos, sweep_curve
from fleet.analysis.perf import summary as perf_summary
from fleet.contracts.gates import PERF_COLUMNS, Gate, perf_key
from fleet.report.svg import PALETTE
from fleet.results import reader
from fleet.results.info import RunInfo

_CAND = ["model", "target", "prompt_set", "prompt_id"]
_PROMPT = ["model", "prompt_set", "prompt_id"]
# fmt: off
ARCH_KEYS = [
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "vocab_size", "rope_theta", "hidden_act",
    "rms_norm_eps", "tie_word_embeddings", "dtype", "torch_dtype",
]
# fmt: on
NO_VERDICT = "No gates configured: no verdict."


@dataclass(frozen=True)
class RunReport:
    """Everything a report shows about one run; frames are keyed by model and target."""

    run_dir: str | Path
    info: RunInfo  # run.json
    tables: dict[str, pl.DataFrame]  # the stored tables but tokens (the plots read requests)
    tokens: pl.LazyFrame  # the tokens table, scanned: the largest by far, never read whole
    parity: pl.DataFrame  # analysis.parity: one row per model x candidate
    first_step: pl.DataFrame  # analysis.first_step: the `top` largest rel_err per candidate
    sequences: pl.DataFrame  # analysis.answers + sequences + prompt, the `top` worst prompts per candidate
    shown: pl.DataFrame  # per candidate: prompts, and how many of them the per-prompt tables show
    accuracy: pl.DataFrame | None  # task_accuracy.accuracy; None: no prompt has an expected answer
    throughput: pl.DataFrame  # throughput.throughput (parity runs, engine-side timestamps)
    scenarios: pl.DataFrame | None  # fleet.analysis.perf.summary per level
    smoke: pl.DataFrame | None  # the smoke table
    load_parity: pl.DataFrame | None  # load_parity.table: per target x scenario x level; None: no `parity:`
    logits: pl.DataFrame | None  # probes.logits_summary
    layers: pl.DataFrame | None  # probes.layer_curve: the error-growth curve
    matrix: pl.DataFrame | None  # per variant: started, gates, throughput (columns.MATRIX)
    consistency: pl.DataFrame | None  # consistency.self_consistency between variants
    noise_floor: pl.DataFrame | None  # noise_floor.self_parity of `repeat:` copies; None: no repeats
    verdicts: pl.DataFrame | None  # gates.evaluate; None: no gates
    environment: pl.DataFrame  # provenance: one row per key, one column per model/target
    architecture: dict[str, dict[str, Any]]  # model -> config.json fields and parameter count ({}: unreadable)
    notices: list[str]
    colors: dict[str, str]  # target -> plot colour, the same in every plot
    sweeps: pl.DataFrame | None = None  # fleet.analysis.perf.sweep_curve; None: no scenario sweeps
    judged: pl.DataFrame | None = None  # task_accuracy.judged: every answer with an expected one (None: no such prompt)
    load_prompts: pl.DataFrame | None = None  # load_parity.evaluate: each load parity prompt's verdicts
    consistency_prompts: pl.DataFrame | None = None  # consistency.prompt_pairs: each variant pair's prompts
    prompt_stats: pl.LazyFrame | None = None  # the prompt_stats table, scanned, where the figures came from it
    figures: Figures | None = None  # parity, every prompt's first step, divergences and sequences

    @functools.cached_property
    def prompts(self) -> pl.DataFrame | None:
        """parity_resample.prompt_frame: every candidate prompt's figures, made when `fleet compare`
        asks (a third of a second per 10M token rows that a report alone does not need)."""
        if self.figures is None:
            return None
        _, first, per_prompt, seqs = self.figures
        return parity_resample.prompt_frame(seqs, first, per_prompt)

    @classmethod
    def build(cls, run_dir: str | Path, *, gates: Sequence[Gate] | None = None, top: int = 20) -> RunReport:
        """Read and compute. `gates` None means the gates recorded in run.json; [] means no verdicts.
        Per-prompt tables keep the `top` worst prompts per candidate (divergences first)."""
        with reader.decoding(run_dir):  # a damaged stored table is bad input, wherever it is first read
            return cls._build(run_dir, gates, top)

    @classmethod
    def _build(cls, run_dir: str | Path, gates: Sequence[Gate] | None, top: int) -> RunReport:
        info = reader.read_info(run_dir)
        ref = info.reference
        scans = reader.load(run_dir)
        tokens, stats = scans.pop("tokens"), scans.pop("prompt_stats")
        # Texts are read for the prompts a table shows and the answers judged, not for every request:
        # on a big run they are most of the requests' bytes (token ids and chat turns are in no figure).
        texts = scans["requests"].select(*_PROMPT, "target", "expected", "prompt", "output_text", "output_token_ids")
        scans["requests"] = scans["requests"].drop("prompt_token_ids", "messages", "prompt", "output_text")
        t = {name: frame.collect() for name, frame in scans.items()}
        requests = t["requests"]
        judged = task_accuracy.judged(texts)
        accuracy = task_accuracy.accuracy_of(judged, ref)
        variants, repeats = info.variants, info.repeats
        spec = NoiseSpec.from_info(info)
        use_stats = reader.covers(run_dir, "prompt_stats", "tokens") and from_stats.usable(stats)
        if use_stats:
            parity, first, per_prompt, seqs = _from_stats(requests, stats, ref, spec)
        else:  # a run written before prompt_stats: the same figures from its token rows
            parity, first, per_prompt, seqs = _from_tokens(requests, tokens, ref, spec)
        sequences = _worst_sequences(texts, ref, seqs, per_prompt, top)
        # One row per run of a level; a sweep's probes (probe > 0) go to its own section, not the levels'.
        runs = perf_summary(t["perf_requests"], t["perf_levels"], slos(info)) if t["perf_levels"].height else None
        swept = {s["name"]: s["sweep"]["min_share"] for s in info.perf if s.get("sweep")}
        load = _load_parity(run_dir, t, requests, tokens, ref, spec, parity, stats=use_stats)
        compared = _consistency(requests, tokens, parity, variants) if variants else None
        report = cls(
            run_dir=run_dir,
            info=info,
            tables=t,
            tokens=tokens,
            parity=parity,
            first_step=first.sort("rel_err", descending=True, nulls_last=True)
            .group_by("model", "target")
            .head(top)
            .sort(_CAND),
            sequences=sequences,
            shown=_shown(first, sequences),
            accuracy=accuracy if accuracy.height else None,
            throughput=throughput.throughput(requests, t["shards"]),
            scenarios=runs.filter(pl.col("probe") == 0) if runs is not None else None,
            smoke=t["smoke"] if t["smoke"].height else None,
            load_parity=load[0] if load else None,
            logits=probes.logits_summary(probes.logits_errors(t["logits"], ref)) if t["logits"].height else None,
            layers=probes.layer_curve(probes.layer_errors(t["layers"], ref)) if t["layers"].height else None,
            matrix=None,
            consistency=consistency.self_consistency_of(compared) if compared is not None else None,
            noise_floor=_noise_floor(requests, stats if use_stats else tokens, repeats, stats=use_stats)
            if repeats
            else None,
            verdicts=None,
            environment=_environment(info),
            architecture={m: architecture(info, m) for m in _models(info, requests)},
            notices=notices(info, requests),
            colors=_colors(info, t | {"tokens": requests.select("target")}),
            sweeps=sweep_curve(runs, swept) if runs is not None and swept else None,
            judged=judged if judged.height else None,
            load_prompts=load[1] if load else None,
            prompt_stats=stats if use_stats else None,
            consistency_prompts=compared.select("model", "target_a", "target_b", *_PROMPT[1:], "_near", "_judged")
            if compared is not None
            else None,
            figures=(parity, first, per_prompt, seqs),
        )
        gates = gate_mod.from_info(info) if gates is None else list(gates)
        verdicts = report.evaluate(gates) if gates else None
        matrix = _matrix(info, requests, report.throughput, verdicts, variants) if variants else None
        return dataclasses.replace(report, verdicts=verdicts, matrix=matrix)

    @property
    def reference(self) -> str:
        return self.info.reference

    @property
    def run_id(self) -> str:
        return self.info.run_id

    @property
    def models(self) -> list[str]:
        return list(self.architecture)

    @property
    def complete(self) -> bool:
        """The run finished with every target and shard."""
        return self.info.complete

    @property
    def gates_passed(self) -> bool | None:
        """None when there were no gates to apply."""
        return None if self.verdicts is None else gate_mod.passed(self.verdicts)

    @property
    def verdict_line(self) -> str:
        v = self.verdicts
        if v is None or v.is_empty():
            return NO_VERDICT
        n_fail, n_skip = int((v["verdict"] == "FAIL").sum()), int((v["verdict"] == "SKIP").sum())
        skipped = f" {n_skip} skipped: no earlier passing run to compare with." if n_skip else ""
        if n_fail:
            return f"FAIL: {n_fail} of {v.height} gate checks fail.{skipped}"
        if n_skip:
            return f"PASS: {v.height - n_skip} of {v.height} gate checks pass, none fails.{skipped}"
        return f"PASS: all {v.height} gate checks pass."

    def metric_frames(self) -> list[pl.DataFrame]:
        """Every per-(model, target) metric, no column in two frames: what gates check and compare diffs."""
        frames = [self.parity, self.throughput]
        if self.accuracy is not None:
            frames.append(self.accuracy.select("model", "target", "accuracy_pct", task_accuracy_delta="delta_points"))
        if self.logits is not None:
            frames.append(self.logits.drop("n_prompts"))
        if self.layers is not None:
            frames.append(probes.layer_summary(self.layers))
        if self.scenarios is not None:
            frames.append(_perf_metrics(self.scenarios))
        if self.consistency is not None and self.consistency.height:
            frames.append(consistency.per_variant(self.consistency))
        if self.load_parity is not None:
            frames.append(load_parity.per_target(self.load_parity))
        return frames

    def evaluate(self, gates: Sequence[Gate]) -> pl.DataFrame:
        """Verdicts of `gates` on this run, every metric available (probes and accuracy included)."""
        parity, throughput, *extra = self.metric_frames()
        return gate_mod.evaluate(
            gates,
            parity,
            throughput,
            run_dir=self.run_dir,
            reference=self.reference,
            expected=gate_mod.expected_pairs(self.info),
            extra=extra,
            doubles=gate_mod.test_doubles(self.info),
            incomplete=gate_mod.incomplete(self.info, self.tables["requests"]),
            runs=self._baselines() if any(g.baseline_runs for g in gates) else None,
        )

    def _baselines(self) -> RunBaselines:
        """The runs gates compare this one with, found in its results root (fleet/analysis/baseline.py)."""
        t = self.tables
        return RunBaselines(self.run_dir, self.info, t["perf_requests"], t["perf_levels"])


def _load_parity(
    run_dir: str | Path,
    t: dict[str, pl.DataFrame],
    requests: pl.DataFrame,
    whole: pl.LazyFrame,
    ref: str,
    spec: NoiseSpec,
    parity: pl.DataFrame,
    *,
    stats: bool,
) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """Parity vs load and its prompts (None: no scenario with `parity:` ran), judged with each
    target's parity noise. `whole`: the tokens table; `stats`: prompt_stats covers it."""
    if not t["load_requests"].height:
        return None
    noise = parity.select("model", "target", "noise") if "noise" in parity.columns else None
    # The reference's rows of the load prompts, from the tokens files that hold them (prompt_stats,
    # written beside each, says which), not a scan of the key columns of every token row.
    keys = load_parity.reference_requests(t["load_requests"], requests, ref).select(_PROMPT)
    where = load_parity.reference_rows(keys, ref)
    narrowed = reader.narrowed(run_dir, "tokens", index="prompt_stats", where=where) if stats else None
    tokens = whole if narrowed is None else narrowed
    return load_parity.evaluate(t["load_requests"], t["load_tokens"], requests, tokens, ref, spec=spec, noise=noise)


def _perf_metrics(scenarios: pl.DataFrame) -> pl.DataFrame:
    """Perf levels as one row per (model, target): `perf_<figure>@<scenario>@<level>` columns."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in scenarios.iter_rows(named=True):
        row = rows.setdefault((r["model"], r["target"]), {"model": r["model"], "target": r["target"]})
        row |= {perf_key(f"perf_{c}", r["scenario"], r["level"]): r.get(c) for c in PERF_COLUMNS}
    return pl.DataFrame(list(rows.values()))


def notices(info: RunInfo, requests: pl.DataFrame) -> list[str]:
    """Lines a reader must see before trusting the figures: failures, retries, test doubles, mixed weights."""
    out = [f"FAILED {key}: {reason}" for key, reason in info.failures.items()]
    out += [f"FAILED shard {shard}: {reason}" for shard, reason in info.failed_shards.items()]
    if info.retries:
        out.append(f"retried calls: {info.retries} (faults survived; rows are written once per shard)")
    doubles = [k for k, p in info.provenance.items() if (p or {}).get("device") == "test-double"]
    if doubles:
        out.append(f"TEST DOUBLE targets (no model ran; figures are meaningless): {', '.join(doubles)}")
    # Each file holds one model's rows under one weight digest: the runs of equal neighbours are
    # few, and grouping them gives what grouping every request gives, without hashing millions.
    pair = requests.select("model", "model_weights")
    changed = pl.any_horizontal(pl.col(c).ne_missing(pl.col(c).shift()).fill_null(True) for c in pair.columns)
    runs = pair.filter(changed | (pl.int_range(pl.len()) == 0))
    weights = runs.group_by("model", maintain_order=True).agg(pl.col("model_weights").unique())
    for model, digests in weights.iter_rows():
        if len(digests) > 1:  # every target of a model must have loaded the same bytes
            out.append(f"WARNING {model}: targets loaded different weights {sorted(digests)}")
    return out


def architecture(info: RunInfo, model: str) -> dict[str, Any]:
    """Selected config.json fields of `model` (model_dir from run.json provenance), plus its parameter count."""
    for key, prov in info.provenance.items():
        model_dir = Path(prov.get("model_dir") or "/nonexistent")
        if key.split("/")[0] == model and (model_dir / "config.json").is_file():
            config = json.loads((model_dir / "config.json").read_text())
            rope = (config.get("rope_parameters") or {}).get("rope_theta")  # transformers 5 moved it here
            out = {k: config[k] for k in ARCH_KEYS if k in config} | ({"rope_theta": rope} if rope else {})
            return out | {"parameters": _parameters(model_dir), "model_dir": str(model_dir)}
    return {}


def _parameters(model_dir: Path) -> str | None:
    """Parameter count from the safetensors headers (no weights read): '135.0M', '7.62B', '40'."""
    from safetensors import safe_open

    total = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(file, framework="numpy") as fh:
            total += sum(math.prod(fh.get_slice(name).get_shape()) for name in fh.keys())  # noqa: SIM118
    if not total:
        return None
    return f"{total / 1e9:.2f}B" if total >= 1e9 else f"{total / 1e6:.1f}M" if total >= 1e6 else f"{total:,}"


def _models(info: RunInfo, requests: pl.DataFrame) -> list[str]:
    """The manifest's models in its order, then any other with results."""
    return list(dict.fromkeys([*info.model_names, *requests["model"].unique(maintain_order=True).to_list()]))


def _colors(info: RunInfo, tables: dict[str, pl.DataFrame]) -> dict[str, str]:
    """One colour per target for every plot: the reference first, then the manifest's order."""
    named = [t["name"] for t in info.targets]
    seen = sorted({t for frame in tables.values() if "target" in frame.columns for t in frame["target"].unique()})
    targets = list(dict.fromkeys([info.reference, *named, *seen]))
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(targets)}


def _shown(first: pl.DataFrame, sequences: pl.DataFrame) -> pl.DataFrame:
    """Per candidate: how many prompts it has and how many rows the per-prompt tables show."""
    counts = first.group_by("model", "target").agg(n_prompts=pl.len())
    shown = sequences.group_by("model", "target").agg(n_shown=pl.len())
    return counts.join(shown, on=["model", "target"], how="left").sort("model", "target")


Figures = tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]  # parity, first step, divergences, sequences


def _from_tokens(requests: pl.DataFrame, tokens: pl.LazyFrame, ref: str, spec: NoiseSpec) -> Figures:
    """The token figures from the token rows: runs written before prompt_stats."""
    noise_table = noise_model.summary(tokens, ref, spec)  # the bootstrap once, for both
    per_prompt = divergence.divergences(requests, tokens, ref, spec=spec, noise_table=noise_table)
    ties = divergence.summary_of(per_prompt, tokens, ref, noise_table=noise_table)
    parity = analysis.parity(requests, tokens, ref).join(ties, on=["model", "target"], how="left")
    return parity, analysis.first_step(tokens, ref), per_prompt, analysis.sequences(requests, ref)


def _from_stats(requests: pl.DataFrame, stats: pl.LazyFrame, ref: str, spec: NoiseSpec) -> Figures:
    """The same figures from prompt_stats: prompts joined with prompts (fleet/analysis/from_stats.py)."""
    pairs = from_stats.Pairs.load(requests, stats, ref)
    first = from_stats.first_step(pairs)
    # The lists the divergences read are decoded while the per-candidate figures run in numpy, each
    # on a core of its own (docs/measurements.md, "fleet report ..., third pass").
    with ThreadPoolExecutor(1) as pool:
        needed = stats_divergences.needs_lists(pairs)  # not where every divergence is its split
        lists = pool.submit(stats_divergences.at_divergence_lists, stats, ref) if needed else None
        parity, noise_table, own = from_stats.figures(pairs, first, spec)
        per_prompt = stats_divergences.divergences(
            pairs, stats, spec, noise_table, lists=lists.result() if lists is not None else None
        )
    parity = parity.join(stats_divergences.summary_of(per_prompt, own, noise_table), on=["model", "target"], how="left")
    return parity, first, per_prompt, pairs.seq


def _noise_floor(requests: pl.DataFrame, rows: pl.LazyFrame, repeats: dict[str, Any], *, stats: bool) -> pl.DataFrame:
    """noise_floor.self_parity from prompt_stats (`stats`) or, for runs before them, from token rows."""
    return (
        noise_floor.from_prompt_stats(requests, rows, repeats)
        if stats
        else noise_floor.self_parity(requests, rows, repeats)
    )


def _worst_sequences(
    texts: pl.LazyFrame, reference: str, seqs: pl.DataFrame, per_prompt: pl.DataFrame, top: int
) -> pl.DataFrame:
    """The `top` worst prompts per candidate (divergence.worst) with analysis.answers (texts, match,
    correctness) and the prompt: texts are read and judged for the prompts shown only."""
    picked = divergence.worst(seqs, per_prompt, top)
    keys = picked.select(_PROMPT).unique()
    # The filter reaches the Parquet reader, which then decodes the texts of those prompts only.
    ids = pl.col("prompt_id").is_in(keys["prompt_id"].implode())
    shown = texts.filter(ids).join(keys.lazy(), on=_PROMPT, how="semi").collect()
    answers = analysis.answers(shown, reference)
    prompts = shown.filter(pl.col("target") == reference).select(*_PROMPT, "prompt")
    return (
        answers.join(picked.drop("kind", "ref_margin", "noise"), on=_CAND, how="inner")
        .join(prompts, on=_PROMPT, how="left")
        .join(picked.select(*_CAND, "kind", "ref_margin", "noise"), on=_CAND, how="left")
        .sort(_CAND)
    )


def _environment(info: RunInfo) -> pl.DataFrame:
    """One row per provenance key (versions, device, host, weights sha), one column per model/target."""
    prov = info.provenance
    keys = list(dict.fromkeys(k for p in prov.values() for k in p if k != "model_dir"))
    data = {"component": keys} | {name: [str(p.get(k, "—")) for k in keys] for name, p in prov.items()}
    return pl.DataFrame(data, schema=dict.fromkeys(data, pl.String))


def _consistency(
    requests: pl.DataFrame, tokens: pl.LazyFrame, parity: pl.DataFrame, variants: dict[str, dict[str, Any]]
) -> pl.DataFrame:
    """Greedy self-consistency per prompt (consistency.prompt_pairs) between variants that differ in
    one setting, their partings judged by the parity's near-tie rule and noise model."""
    return consistency.prompt_pairs(
        requests,
        {n: v["base"] for n, v in variants.items()},
        settings={n: v["settings"] for n, v in variants.items()},
        tokens=tokens,
        noise=parity.select("model", "target", "noise") if "noise" in parity.columns else None,
    )


def _matrix(
    info: RunInfo,
    requests: pl.DataFrame,
    throughput: pl.DataFrame,
    verdicts: pl.DataFrame | None,
    variants: dict[str, dict[str, Any]],
) -> pl.DataFrame:
    """The feature matrix, per model x variant: did it start, did it pass its gates, its throughput."""
    failures, provenance = info.failures, info.provenance
    rows = []
    for model in sorted({k.split("/")[0] for k in provenance} | set(requests["model"].unique())):
        for name, variant in variants.items():
            key, mine = f"{model}/{name}", (pl.col("model") == model) & (pl.col("target") == name)
            checks = verdicts.filter(mine) if verdicts is not None else None
            tok_s = throughput.filter(mine)["output_tok_s"]
            rows.append(
                {
                    "model": model,
                    "variant": name,
                    "settings": ", ".join(f"{k}={v}" for k, v in variant["settings"].items()),
                    "started": key in provenance and key not in failures,
                    "gates": "n/a"
                    if checks is None or checks.is_empty()
                    else ("PASS" if gate_mod.passed(checks) else "FAIL"),
                    "output_tok_s": tok_s[0] if tok_s.len() else None,
                    "failure": failures.get(key),
                }
            )
    schema = {"model": pl.String, "variant": pl.String, "settings": pl.String, "started": pl.Boolean}
    schema |= {"gates": pl.String, "output_tok_s": pl.Float64, "failure": pl.String}
    return pl.DataFrame(rows, schema=schema)
