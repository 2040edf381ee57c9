"""What an actor slot is fed: one class per kind of work (describe, smoke, generate, score,
probe; perf levels in fleet/run/perf_work.py), each saying which call it makes to the target's
actor and what should follow its result, or its being given up, as `Effects`.

Work only says what should happen; the dispatch loop (fleet/run/scheduler.py) applies it, and
decides everything that depends on the run's state. The loop knows only the `Work` interface: it
sends, waits, retries a failed call up to `run.max_attempts` and then abandons it; a new kind of
work is a new class here, not a new branch there.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from fleet.contracts import schema
from fleet.run.manifest import probe_capability

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

    from fleet.contracts.engine import Generation
    from fleet.contracts.spec import ModelSpec, Shard
    from fleet.contracts.targets import TargetArgs
    from fleet.results.staging import Staging
    from fleet.run.manifest import Manifest
    from fleet.run.plan import ProbeCall


class SlotView(Protocol):
    """What work reads of the slot it runs in (`ActorSlot`, fleet/run/slots.py); it changes nothing."""

    @property
    def handle(self) -> Any: ...
    @property
    def manifest(self) -> Manifest: ...
    @property
    def model(self) -> ModelSpec: ...
    @property
    def target(self) -> TargetArgs: ...


@dataclass(frozen=True)
class Write:
    """Rows of one table, stored under `key`."""

    table: str
    key: str
    rows: pa.Table


@dataclass(frozen=True)
class ShardRows:
    """A shard's tables: requests and the shards row from `gen`, and its token rows (the
    candidate's own, or joined with the reference's scores)."""

    gen: Generation
    tokens: pa.Table
    # Run once the shard is committed (its shards row written): its staged copy is removed.
    then: Callable[[], None] | None = None


@dataclass(frozen=True)
class Effects:
    """What should follow one call's result, or its being given up. Empty: nothing."""

    provenance: dict[str, str] | None = None  # what the target's engine runs
    smoked: bool = False  # the target's smoke checks ran: a later actor of it does not repeat them
    writes: tuple[Write, ...] = ()  # stored at once, in this order
    shard: ShardRows | None = None  # stored on a writer thread; counts as progress once written
    # Follow-up work for the reference; with no reference (left) the rows are written unscored.
    score: Score | None = None
    target_failed: str | None = None  # why the whole target fails (the first reason recorded stands)
    failed_shard: tuple[str, str] | None = None  # (its id in run.json's failed_shards, why)
    progress: int = 0  # planned shards or perf levels ended with no shard rows to write


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
    def submit(self, slot: SlotView) -> tuple[Any, float]:
        """Send the call to the slot's actor: its object ref and the seconds it may take."""

    @abstractmethod
    def on_result(self, slot: SlotView, result: Any) -> Effects:
        """What should follow the call's result: rows to store, work for the reference, failures."""

    @abstractmethod
    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        """What should follow its not being done: its last attempt failed, or its target did."""


def _where(slot: SlotView) -> str:
    """The model/target prefix of the slot's result keys."""
    return f"{slot.model.name}/{slot.target.name}"


@dataclass(frozen=True)
class Describe(Work):
    """The first call to every actor: it answers once the engine is up, with its provenance."""

    starts_actor: ClassVar[bool] = True

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        return slot.handle.describe.remote(), slot.manifest.run.start_timeout_s

    def on_result(self, slot: SlotView, result: dict[str, str]) -> Effects:
        return Effects(provenance=result)

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        """Nothing of its own: the loop records the target's failure."""
        return Effects()


@dataclass(frozen=True)
class Smoke(Work):
    """Checks of a server's API routes, once per target, on its first actor."""

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        return slot.handle.smoke.remote(), slot.manifest.run.shard_timeout_s

    def on_result(self, slot: SlotView, result: pa.Table) -> Effects:
        failed = [row["check"] for row in result.to_pylist() if not row["passed"]]
        return Effects(
            smoked=True,
            writes=(Write("smoke", f"{_where(slot)}/smoke/00000", result),),
            target_failed=f"smoke checks failed: {', '.join(failed)}" if failed else None,
        )

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        return Effects(target_failed=f"smoke checks: {reason}")


@dataclass(frozen=True)
class Generate(Work):
    """A shard's prompts through the target; a candidate's rows then go to the reference to score."""

    shard: Shard

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        return slot.handle.generate.remote(self.shard), slot.manifest.run.shard_timeout_s

    def on_result(self, slot: SlotView, result: Generation) -> Effects:
        failed = f"non-finite logprobs in shard {self.shard.shard_id}" if _non_finite(result.tokens) else None
        if slot.target.name == slot.manifest.reference:
            return Effects(shard=ShardRows(result, result.tokens), target_failed=failed)
        return Effects(score=Score(self.shard, result), target_failed=failed)

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        return Effects(failed_shard=(self.shard.shard_id, reason), progress=1)


@dataclass(frozen=True)
class Score(Work):
    """A candidate's shard scored by the reference (teacher forcing), then written with its columns."""

    shard: Shard
    gen: Generation  # the candidate's rows

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        m = slot.manifest
        # The precision twin scores at the candidate's dtype (a model's own dtype beats the target's).
        dtype = next(x.dtype for x in m.models if x.name == self.shard.model) or m.target(self.shard.target).dtype
        call = slot.handle.score.remote(self.gen.requests, k=m.sampling.logprobs, twin=dtype if m.parity.twin else None)
        return call, m.run.shard_timeout_s

    def on_result(self, slot: SlotView, result: pa.Table) -> Effects:
        return Effects(shard=ShardRows(self.gen, join_scores(self.gen.tokens, result)))

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        # The candidate's own rows stand; record that they lack the reference's columns.
        return Effects(shard=self.unscored, failed_shard=(self.shard.shard_id, f"unscored: {reason}"))

    @property
    def unscored(self) -> ShardRows:
        """The candidate's own rows, without the reference's columns."""
        return ShardRows(self.gen, self.gen.tokens)

    # Taking turns, its rows wait for the reference on disk (fleet/results/staging.py); False: in
    # the reference's queue, for its next turn (a few rows, nothing a resume needs).
    staged: ClassVar[bool] = True

    def without_reference(self) -> Effects:
        """What is written when no reference is left to score with: the rows, unscored."""
        return Effects(shard=self.unscored)


@dataclass(frozen=True)
class ScoreStaged(Work):
    """A candidate's shard generated while the reference was down (its model's targets take
    turns), scored as `Score` does from its stored rows (fleet/results/staging.py), which go once
    it is committed. The rows are read when the call is sent and again when its scores are in:
    the driver holds none of them in between, however many shards wait."""

    shard: Shard
    weights: str  # what its rows are staged under
    staging: Staging = field(compare=False, repr=False)

    @property
    def label(self) -> str:
        return "score"

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        return self._score().submit(slot)

    def on_result(self, slot: SlotView, result: pa.Table) -> Effects:
        return self._dropped_once_written(self._score().on_result(slot, result))

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        return self._dropped_once_written(self._score().on_abandon(slot, reason))

    def _score(self) -> Score:
        return Score(self.shard, self.staging.get(self.shard.shard_id, self.weights))

    def _dropped_once_written(self, effects: Effects) -> Effects:
        assert effects.shard is not None  # Score writes the shard, scored or not
        drop = functools.partial(self.staging.drop, self.shard.shard_id, self.weights)
        return replace(effects, shard=replace(effects.shard, then=drop))


@dataclass(frozen=True)
class Probe(Work):
    """A deep probe (full-vocabulary logprobs, or hidden states) on the manifest's prompt set."""

    probe: ProbeCall

    @property
    def label(self) -> str:
        return self.probe.kind

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        spec = getattr(slot.manifest.probes, self.probe.kind)
        # A capability's actor method is named after it: probe_logits, probe_layers.
        method = getattr(slot.handle, probe_capability(self.probe.kind))
        call = method.remote(
            slot.manifest.prompt_list(spec.prompt_set), prompt_set=spec.prompt_set, positions=spec.positions
        )
        return call, slot.manifest.run.shard_timeout_s

    def on_result(self, slot: SlotView, result: pa.Table) -> Effects:
        prompt_set = getattr(slot.manifest.probes, self.probe.kind).prompt_set
        return Effects(writes=(Write(self.probe.kind, f"{_where(slot)}/{prompt_set}/probe", result),))

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        return Effects(failed_shard=(self.probe.key, reason))


def _non_finite(tokens: pa.Table) -> bool:
    import pyarrow.compute as pc

    lp = tokens.column("logprob")
    return bool(len(lp)) and not pc.all(pc.is_finite(lp.fill_null(0.0))).as_py()


def join_scores(tokens: pa.Table, scores: pa.Table, *, into: pa.Schema = schema.TOKENS) -> pa.Table:
    """`tokens` with the reference's `scores` on each (prompt_id, position), as table `into`."""
    import polars as pl

    keys = ["prompt_id", "position"]
    joined = (
        pl.from_arrow(tokens)
        .drop(schema.SCORE_COLUMNS)  # type: ignore[union-attr]
        .join(pl.from_arrow(scores), on=keys, how="left", maintain_order="left")  # type: ignore[arg-type]
    )
    return schema.conform(joined.to_arrow(), into)
