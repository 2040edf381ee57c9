"""One run's report, computed once from its run directory: every figure the text summary, the
HTML and Markdown reports and `fleet compare` show.

`RunReport.build` reads the run (a local directory or a URI such as s3://bucket/prefix/run_id,
through fleet.results.reader) and computes, with fleet.analysis: parity, first step and full
sequences (from prompt_stats or token rows: fleet.report.figures), task accuracy, parity-run
throughput, perf-scenario levels, smoke checks, the logits and layer probes, the feature matrix
with its self-consistency (fleet.report.feature_matrix), gate verdicts, and from run.json the
environment, the architectures and the notices a reader must not miss (fleet.report.provenance).
A frame is None when the run did not measure it (no expected answers, no perf scenario, no probe,
no matrix); the renderers then say so. fleet.report.sections turns the object into titled
sections, which each format lays out.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from fleet.analysis import (
    consistency,
    from_stats,
    key_blocks,
    load_parity,
    parity_resample,
    probes,
    task_accuracy,
    throughput,
)
from fleet.analysis import gates as gate_mod
from fleet.analysis.baseline import RunBaselines
from fleet.analysis.noise_model import NoiseSpec
from fleet.analysis.perf import slos, sweep_curve
from fleet.analysis.perf import summary as perf_summary
from fleet.contracts.gates import PERF_COLUMNS, Gate, perf_key
from fleet.report import feature_matrix, figures, provenance
from fleet.report.figures import PROMPT, Figures
from fleet.report.svg import PALETTE
from fleet.results import reader
from fleet.results.info import RunInfo

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
    request_blocks: key_blocks.Blocks | None = None  # key_blocks.blocks of the requests' keys (None: not in blocks)

    @functools.cached_property
    def prompts(self) -> pl.DataFrame | None:
        """parity_resample.prompt_frame: every candidate prompt's figures, made when `fleet compare`
        asks (a third of a second per 10M token rows that a report alone does not need)."""
        if self.figures is None:
            return None
        _, first, per_prompt, seqs = self.figures
        return parity_resample.prompt_frame(seqs, first, per_prompt)

    @classmethod
    def build(
        cls,
        run_dir: str | Path,
        *,
        gates: Sequence[Gate] | None = None,
        top: int = 20,
        say: Callable[[str], None] = lambda step: None,
    ) -> RunReport:
        """Read and compute. `gates` None means the gates recorded in run.json; [] means no verdicts.
        Per-prompt tables keep the `top` worst prompts per candidate (divergences first). `say` is
        told each step as it starts (fleet/report/status.py)."""
        with reader.decoding(run_dir):  # a damaged stored table is bad input, wherever it is first read
            return cls._build(run_dir, gates, top, say)

    @classmethod
    def _build(
        cls, run_dir: str | Path, gates: Sequence[Gate] | None, top: int, say: Callable[[str], None]
    ) -> RunReport:
        say("reading the run's tables")
        info = reader.read_info(run_dir)
        ref = info.reference
        scans = reader.load(run_dir)
        tokens, stats = scans.pop("tokens"), scans.pop("prompt_stats")
        # Texts are read for the prompts a table shows and the answers judged, not for every request:
        # on a big run they are most of the requests' bytes (token ids and chat turns are in no figure).
        texts = scans["requests"].select(*PROMPT, "target", "expected", "prompt", "output_text", "output_token_ids")
        # Nor is the shard id, the finish reason or the queueing time, in no figure either (a third
        # of the rest: 40 MB at 10M token rows).
        unread = ["prompt_token_ids", "messages", "prompt", "output_text", "shard_id", "finish_reason", "queue_s"]
        scans["requests"] = scans["requests"].drop(unread)
        t = dict(zip(scans, pl.collect_all(scans.values()), strict=True))  # read side by side
        requests = t["requests"]
        judged = task_accuracy.judged(texts)
        accuracy = task_accuracy.accuracy_of(judged, ref)
        variants, repeats = info.variants, info.repeats
        spec = NoiseSpec.from_info(info)
        use_stats = reader.covers(run_dir, "prompt_stats", "tokens") and from_stats.usable(stats)
        say(f"pairing each candidate's answers with the reference's ({requests.height:,} requests)")
        # Found once for the pairing and the gates' coverage (each found them: 0.5 s at 100M token rows).
        blocks = key_blocks.blocks(requests.select(figures.CANDIDATE))
        pairs = from_stats.Pairs.load(requests, stats, ref, blocks) if use_stats else None
        # The noise floor first: what it allocates is then reused by the figures (after them it
        # would add to their peak, 90 MB at 10M token rows).
        rows = stats if use_stats else tokens
        say("parity figures")
        noise = figures.noise_floor_of(requests, rows, repeats, stats=use_stats, pairs=pairs) if repeats else None
        if pairs is not None:
            pairs = pairs.without_ids()  # the pairing's and the noise floor's, read no more
            parity, first, per_prompt, seqs = figures.from_pairs(pairs, stats, spec)
        else:  # a run written before prompt_stats: the same figures from its token rows
            parity, first, per_prompt, seqs = figures.from_token_rows(requests, tokens, ref, spec)
        del pairs  # the candidates' stats rows: the largest frames of a big report
        say(f"the {top} worst prompts of each candidate, perf, probes and gates")
        sequences = figures.worst_sequences(texts, ref, seqs, per_prompt, top)
        # One row per run of a level; a sweep's probes (probe > 0) go to its own section, not the levels'.
        runs = perf_summary(t["perf_requests"], t["perf_levels"], slos(info)) if t["perf_levels"].height else None
        swept = {s["name"]: s["sweep"]["min_share"] for s in info.perf if s.get("sweep")}
        load = figures.load_parity_of(run_dir, t, requests, tokens, ref, spec, parity, stats=use_stats)
        compared = feature_matrix.consistency_pairs(requests, tokens, parity, variants) if variants else None
        report = cls(
            run_dir=run_dir,
            info=info,
            tables=t,
            tokens=tokens,
            parity=parity,
            first_step=figures.worst_first_steps(first, top),
            sequences=sequences,
            shown=figures.shown(first, sequences),
            accuracy=accuracy if accuracy.height else None,
            throughput=throughput.throughput(requests, t["shards"]),
            scenarios=runs.filter(pl.col("probe") == 0) if runs is not None else None,
            smoke=t["smoke"] if t["smoke"].height else None,
            load_parity=load[0] if load else None,
            logits=probes.logits_summary(probes.logits_errors(t["logits"], ref)) if t["logits"].height else None,
            layers=probes.layer_curve(probes.layer_errors(t["layers"], ref)) if t["layers"].height else None,
            matrix=None,
            consistency=consistency.self_consistency_of(compared) if compared is not None else None,
            noise_floor=noise,
            verdicts=None,
            environment=provenance.environment(info),
            architecture={m: provenance.architecture(info, m) for m in _models(info, requests)},
            notices=provenance.notices(info, requests),
            colors=_colors(info, t | {"tokens": requests.select("target")}),
            sweeps=sweep_curve(runs, swept) if runs is not None and swept else None,
            judged=judged if judged.height else None,
            load_prompts=load[1] if load else None,
            prompt_stats=stats if use_stats else None,
            consistency_prompts=compared.select("model", "target_a", "target_b", *PROMPT[1:], "_near", "_judged")
            if compared is not None
            else None,
            figures=(parity, first, per_prompt, seqs),
            request_blocks=blocks,
        )
        gates = gate_mod.from_info(info) if gates is None else list(gates)
        verdicts = report.evaluate(gates) if gates else None
        matrix = feature_matrix.matrix(info, requests, report.throughput, verdicts, variants) if variants else None
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
            incomplete=gate_mod.incomplete(self.info, self.tables["requests"], self.request_blocks),
            runs=self._baselines() if any(g.baseline_runs for g in gates) else None,
        )

    def _baselines(self) -> RunBaselines:
        """The runs gates compare this one with, found in its results root (fleet/analysis/baseline.py)."""
        t = self.tables
        return RunBaselines(self.run_dir, self.info, t["perf_requests"], t["perf_levels"])


def _perf_metrics(scenarios: pl.DataFrame) -> pl.DataFrame:
    """Perf levels as one row per (model, target): `perf_<figure>@<scenario>@<level>` columns."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in scenarios.iter_rows(named=True):
        row = rows.setdefault((r["model"], r["target"]), {"model": r["model"], "target": r["target"]})
        row |= {perf_key(f"perf_{c}", r["scenario"], r["level"]): r.get(c) for c in PERF_COLUMNS}
    return pl.DataFrame(list(rows.values()))


def _models(info: RunInfo, requests: pl.DataFrame) -> list[str]:
    """The manifest's models in its order, then any other with results."""
    return list(dict.fromkeys([*info.model_names, *requests["model"].unique(maintain_order=True).to_list()]))


def _colors(info: RunInfo, tables: dict[str, pl.DataFrame]) -> dict[str, str]:
    """One colour per target for every plot: the reference first, then the manifest's order."""
    named = [t["name"] for t in info.targets]
    seen = sorted({t for frame in tables.values() if "target" in frame.columns for t in frame["target"].unique()})
    targets = list(dict.fromkeys([info.reference, *named, *seen]))
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(targets)}
