"""Expanding a manifest into the run's work: shards (model x target x prompt-set chunk), perf
levels and probes, each with an id that is stable across runs of one manifest (resume relies on it).

A shard is what one actor generates in one call, what is retried when an actor dies, and what
is written as one Parquet file per table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet.contracts.prompt_source import FileSlice, PromptFile, chunks
from fleet.contracts.spec import PROBE_KINDS, ProbeKind, Shard
from fleet.run.manifest import Manifest

if TYPE_CHECKING:
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.spec import Scenario


def plan(manifest: Manifest) -> list[Shard]:
    """All shards, grouped by model; within a model the reference's shards come first. A file's
    shards carry row ranges, not prompts: the driver's memory does not grow with the file."""
    targets = sorted((t for t in manifest.targets if t.parity), key=lambda t: t.name != manifest.reference)
    cut = {name: _chunks(prompts, manifest.run.shard_size) for name, prompts in manifest.prompts.items()}
    return [
        Shard(model.name, target.name, set_name, i, prompts, rows)
        for model in manifest.models
        for target in targets
        for set_name, chunks_ in cut.items()
        for i, (prompts, rows) in enumerate(chunks_)
    ]


def _chunks(prompts: list[Prompt] | PromptFile, size: int) -> list[tuple[tuple[Prompt, ...], FileSlice | None]]:
    """One prompt set cut into shards of `size` prompts: the prompts, or the file slice holding them."""
    if isinstance(prompts, PromptFile):
        return [((), piece) for piece in chunks(prompts, size)]
    return [(tuple(prompts[i : i + size]), None) for i in range(0, len(prompts), size)]


@dataclass(frozen=True)
class PerfRun:
    """One level of one perf scenario on one model x target: one call, one perf_levels row."""

    model: str
    target: str
    scenario: Scenario
    level: int

    @property
    def run_id(self) -> str:
        return f"{self.model}/{self.target}/{self.scenario.name}/{self.level:05d}"


def plan_perf(manifest: Manifest) -> list[PerfRun]:
    """Every scenario x level on every perf-capable target it applies to, per model."""
    return [
        PerfRun(model.name, target.name, scenario, level)
        for model in manifest.models
        for target in manifest.targets
        if target.can("perf")
        for scenario in manifest.perf
        if scenario.targets is None or target.name in scenario.targets
        for level in scenario.concurrency
    ]


@dataclass(frozen=True)
class ProbeRun:
    """One deep probe ("logits" or "layers") on one model x target: one call, one table's rows."""

    model: str
    target: str
    kind: ProbeKind

    @property
    def run_id(self) -> str:
        """Its key in run.json's failed_shards."""
        return f"{self.model}/{self.target}/probe-{self.kind}"


def plan_probes(manifest: Manifest) -> list[ProbeRun]:
    """Every probe the manifest asks for, on every target it runs on, per model."""
    return [
        ProbeRun(model.name, target, kind)
        for model in manifest.models
        for kind in PROBE_KINDS
        for target in manifest.probed(kind)
    ]
