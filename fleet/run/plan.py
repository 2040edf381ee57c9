"""Expanding a manifest into the run's work, one `ModelPlan` per model: its shards (target x
prompt-set chunk), perf levels and probe calls, each with an id that is stable across runs of one
manifest (resume relies on it).

A shard is what one actor generates in one call, what is retried when an actor dies, and what
is written as one Parquet file per table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleet.contracts.prompt_source import FileSlice, PromptFile, chunks
from fleet.contracts.spec import PROBE_KINDS, DrillPoint, ProbeKind, Shard
from fleet.run.manifest import Manifest

if TYPE_CHECKING:
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.scenario import Scenario


@dataclass(frozen=True)
class ModelPlan:
    """Everything one model of the run is to do; what the scheduler admits as one."""

    model: str
    shards: list[Shard]
    perf: list[PerfLevel]
    probes: list[ProbeCall]
    drills: list[DrillCall] = field(default_factory=list)  # the drill-down's, once parity is stored

    def __bool__(self) -> bool:
        return bool(self.shards or self.perf or self.probes or self.drills)

    def remaining(self, shards_done: set[str], perf_done: set[str], probes_done: set[str]) -> ModelPlan:
        """This plan without what a killed run already stored (by id): what `--resume` still does."""
        return ModelPlan(
            self.model,
            [s for s in self.shards if s.shard_id not in shards_done],
            [p for p in self.perf if p.key not in perf_done],
            [p for p in self.probes if p.key not in probes_done],
        )


def plan(manifest: Manifest) -> list[ModelPlan]:
    """One plan per model of the manifest, in its order."""
    shards, perf, probes = plan_shards(manifest), plan_perf(manifest), plan_probes(manifest)
    return [
        ModelPlan(
            m.name,
            [s for s in shards if s.model == m.name],
            [p for p in perf if p.model == m.name],
            [p for p in probes if p.model == m.name],
        )
        for m in manifest.models
    ]


def plan_shards(manifest: Manifest) -> list[Shard]:
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
class PerfLevel:
    """One level of one perf scenario on one model x target: one call, one perf_levels row."""

    model: str
    target: str
    scenario: Scenario
    level: int

    @property
    def key(self) -> str:
        """Its id in the perf_levels table and in run.json's failed_shards."""
        return f"{self.model}/{self.target}/{self.scenario.name}/{self.level:05d}"


def plan_perf(manifest: Manifest) -> list[PerfLevel]:
    """Every scenario x level on every perf-capable target it applies to, per model."""
    return [
        PerfLevel(model.name, target.name, scenario, level)
        for model in manifest.models
        for target in manifest.targets
        if target.can("perf")
        for scenario in manifest.perf
        if scenario.targets is None or target.name in scenario.targets
        for level in scenario.concurrency
    ]


@dataclass(frozen=True)
class ProbeCall:
    """One deep probe ("logits" or "layers") on one model x target: one call, one table's rows."""

    model: str
    target: str
    kind: ProbeKind

    @property
    def key(self) -> str:
        """Its id in run.json's failed_shards (and, as (model, target, kind), in its table)."""
        return f"{self.model}/{self.target}/probe-{self.kind}"


def plan_probes(manifest: Manifest) -> list[ProbeCall]:
    """Every probe the manifest asks for, on every target it runs on, per model."""
    return [
        ProbeCall(model.name, target, kind)
        for model in manifest.models
        for kind in PROBE_KINDS
        for target in manifest.probed(kind)
    ]


@dataclass(frozen=True)
class DrillCall:
    """The layer probe on one target at every point of one model; `twin` (a dtype): on the
    reference's precision twin at that dtype instead of its own model."""

    model: str
    target: str
    twin: str | None
    points: tuple[DrillPoint, ...]

    @property
    def key(self) -> str:
        """Its id in run.json's failed_shards and in the store."""
        return f"{self.model}/{self.target}/drilldown/{self.twin or 'own'}"
