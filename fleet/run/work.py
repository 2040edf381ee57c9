"""What an actor slot is fed: one class per kind of work (describe, smoke, generate, score,
probe, perf level), each saying which call it makes to the target's actor, what becomes of the
result, and what is recorded when it is given up.

The dispatch loop (fleet/run/scheduler.py) knows only the `Work` interface: it sends, waits,
retries a failed call up to `run.max_attempts` and then abandons it; a new kind of work is a new
class here, not a new branch there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from fleet.contracts import schema
from fleet.run.manifest import probe_capability

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet.contracts.engine import Generation, PerfResult
    from fleet.contracts.spec import Shard
    from fleet.run.plan import PerfRun, ProbeRun
    from fleet.run.scheduler import Loop
    from fleet.run.slots import ActorSlot, ModelRun


@dataclass(frozen=True)
class Work(ABC):
    """One call to a target's actor; `attempt` counts its tries."""

    attempt: int = field(default=1, kw_only=True)
    # Its failure means the actor never came up: the whole target fails, nothing is retried.
    starts_actor: ClassVar[bool] = False
    # On a CPU target nothing else may run meanwhile: timings are only honest with the cores to itself.
    alone_on_cpu: ClassVar[bool] = False

    @property
    def label(self) -> str:
        """What it is, in progress messages."""
        return type(self).__name__.lower()

    def retried(self) -> Work:
        return replace(self, attempt=self.attempt + 1)

    @abstractmethod
    def submit(self, slot: ActorSlot) -> tuple[Any, float]:
        """Send the call to the slot's actor: its object ref and the seconds it may take."""

    @abstractmethod
    def on_result(self, loop: Loop, run: ModelRun, name: str, result: Any) -> None:
        """Record what target `name`'s call returned, or pass it on as more work."""

    @abstractmethod
    def on_abandon(self, loop: Loop, run: ModelRun, name: str, reason: str) -> None:
        """Record that it will not be done: its last attempt failed, or its target did."""


@dataclass(frozen=True)
class Describe(Work):
    """The first call to every actor: it answers once the engine is up, with its provenance."""

    starts_actor: ClassVar[bool] = True

    def submit(self, slot: ActorSlot) -> tuple[Any, float]:
        return slot.handle.describe.remote(), slot.manifest.run.start_timeout_s

    def on_result(self, loop: Loop, run: ModelRun, name: str, result: dict[str, str]) -> None:
        run.slots[name].alive = True
        loop.outcome.provenance[f"{run.model.name}/{name}"] = result

    def on_abandon(self, loop: Loop, run: ModelRun, name: str, reason: str) -> None:
        """Nothing of its own: the loop records the target's failure."""


@dataclass(frozen=True)
class Smoke(Work):
    """Checks of a server's API routes, once per target, on its first actor."""

    def submit(self, slot: ActorSlot) -> tuple[Any, float]:
        return slot.handle.smoke.remote(), slot.manifest.run.shard_timeout_s

    def on_result(self, loop: Loop, run: ModelRun, name: str, result: pa.Table) -> None:
        run.slots[name].smoked = True
        loop.store.write("smoke", f"{run.model.name}/{name}/smoke/00000", result)
        if failed := [row["check"] for row in result.to_pylist() if not row["passed"]]:
            loop.outcome.failures.setdefault(f"{run.model.name}/{name}", f"smoke checks failed: {', '.join(failed)}")

    def on_abandon(self, loop: Loop, run: ModelRun, name: str, reason: str) -> None:
        loop.outcome.failures.setdefault(f"{run.model.name}/{name}", f"smoke checks: {reason}")


@dataclass(frozen=True)
class Generate(Work):
    """A shard's prompts through the target; a candidate's rows then go to the reference to score."""

    shard: Shard

    def submit(self, slot: ActorSlot) -> tuple[Any, float]:
        return slot.handle.generate.remote(self.shard), slot.manifest.run.shard_timeout_s

    def on_result(self, loop: Loop, run: ModelRun, name: str, result: Generation) -> None:
        if _non_finite(result.tokens):
            loop.outcome.failures.setdefault(
                f"{run.model.name}/{name}", f"non-finite logprobs in shard {self.shard.shard_id}"
            )
        ref_slot = run.slots[run.ref]
        if name == run.ref or ref_slot.handle is None:  # no reference (left) to score with
            loop.write_shard(result, result.tokens)
        else:
            # Scored before the reference's own next shard: a candidate's rows wait in the driver
            # only until the reference is free, so memory does not grow with the prompt count.
            ahead = (i for i, w in enumerate(ref_slot.queue) if not isinstance(w, Describe | Smoke | Score))
            ref_slot.queue.insert(next(ahead, len(ref_slot.queue)), Score(self.shard, result))
            run.unscored += 1

    def on_abandon(self, loop: Loop, run: ModelRun, name: str, reason: str) -> None:
        loop.outcome.failed_shards[self.shard.shard_id] = reason
        loop.bar.update(1, model=run.model.name)


@dataclass(frozen=True)
class Score(Work):
    """A candidate's shard scored by the reference (teacher forcing), then written with its columns."""

    shard: Shard
    gen: Generation  # the candidate's rows

    def submit(self, slot: ActorSlot) -> tuple[Any, float]:
        m = slot.manifest
        # The precision twin scores at the candidate's dtype (a model's own dtype beats the target's).
        dtype = next(x.dtype for x in m.models if x.name == self.shard.model) or m.target(self.shard.target).dtype
        call = slot.handle.score.remote(self.gen.requests, k=m.sampling.logprobs, twin=dtype if m.parity.twin else None)
        return call, m.run.shard_timeout_s

    def on_result(self, loop: Loop, run: ModelRun, name: str, result: pa.Table) -> None:
        run.unscored -= 1
        loop.write_shard(self.gen, _join_scores(self.gen.tokens, result))

    def on_abandon(self, loop: Loop, run: ModelRun, name: str, reason: str) -> None:
        run.unscored -= 1
        # The candidate's own rows stand; record that they lack the reference's columns.
        loop.outcome.failed_shards.setdefault(self.shard.shard_id, f"unscored: {reason}")
        loop.write_shard(self.gen, self.gen.tokens)


@dataclass(frozen=True)
class Probe(Work):
    """A deep probe (full-vocabulary logprobs, or hidden states) on the manifest's prompt set."""

    probe: ProbeRun

    @property
    def label(self) -> str:
        return self.probe.kind

    def submit(self, slot: ActorSlot) -> tuple[Any, float]:
        spec = getattr(slot.manifest.probes, self.probe.kind)
        # A capability's actor method is named after it: probe_logits, probe_layers.
        method = getattr(slot.handle, probe_capability(self.probe.kind))
        call = method.remote(
            slot.manifest.prompt_list(spec.prompt_set), prompt_set=spec.prompt_set, positions=spec.positions
        )
        return call, slot.manifest.run.shard_timeout_s

    def on_result(self, loop: Loop, run: ModelRun, name: str, result: pa.Table) -> None:
        prompt_set = getattr(loop.manifest.probes, self.probe.kind).prompt_set
        loop.store.write(self.probe.kind, f"{run.model.name}/{name}/{prompt_set}/probe", result)

    def on_abandon(self, loop: Loop, run: ModelRun, name: str, reason: str) -> None:
        loop.outcome.failed_shards[self.probe.run_id] = reason


@dataclass(frozen=True)
class Perf(Work):
    """One concurrency level of a perf scenario; a target's levels run after its parity work."""

    level: PerfRun
    alone_on_cpu: ClassVar[bool] = True

    def submit(self, slot: ActorSlot) -> tuple[Any, float]:
        scenario = self.level.scenario
        prompts = slot.manifest.prompt_list(scenario.prompt_set) if scenario.prompt_set else None
        return slot.handle.perf.remote(scenario, self.level.level, prompts), slot.manifest.run.shard_timeout_s

    def on_result(self, loop: Loop, run: ModelRun, name: str, result: PerfResult) -> None:
        loop.store.write("perf_requests", self.level.run_id, result.requests)
        loop.store.write("perf_levels", self.level.run_id, result.level)
        loop.bar.update(1, model=run.model.name)

    def on_abandon(self, loop: Loop, run: ModelRun, name: str, reason: str) -> None:
        loop.outcome.failed_shards[self.level.run_id] = reason
        loop.bar.update(1, model=run.model.name)


def _non_finite(tokens: pa.Table) -> bool:
    import pyarrow.compute as pc

    lp = tokens.column("logprob")
    return bool(len(lp)) and not pc.all(pc.is_finite(lp.fill_null(0.0))).as_py()


def _join_scores(tokens: pa.Table, scores: pa.Table) -> pa.Table:
    import polars as pl

    keys = ["prompt_id", "position"]
    joined = (
        pl.from_arrow(tokens)
        .drop(schema.SCORE_COLUMNS)  # type: ignore[union-attr]
        .join(pl.from_arrow(scores), on=keys, how="left", maintain_order="left")  # type: ignore[arg-type]
    )
    return schema.conform(joined.to_arrow(), schema.TOKENS)
