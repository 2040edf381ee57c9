"""What an actor slot is fed: the `Work` interface, one call to a target's actor; `Effects`, what
should follow its result or its being given up; and a shard's work, which `Effects` is shaped
around: `Generate`, its prompts through the target, and `Score`, a candidate's rows teacher-forced
by the reference, held in memory or (`ScoreStaged`) read back from the staging area.

The other kinds of work are classes in the modules beside this one: a target's calls besides its
shards (describe, smoke, probe) in fleet/run/target_work.py, perf levels in fleet/run/perf_work.py,
the drill-down's in fleet/run/drill.py. Work only says what should happen; the dispatch loop
(fleet/run/scheduler.py) applies it (fleet/run/follow_up.py), and decides everything that depends
on the run's state. The loop knows only this interface: it sends, waits, retries a failed call up
to `run.max_attempts` and then abandons it; a new kind of work is a new class, not a new branch
there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from fleet.results.direct import DirectSink, Written
from fleet.results.packed import Packed
from fleet.results.scores import join_scores

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

    from fleet.contracts.engine import Generation
    from fleet.contracts.spec import ModelSpec, Sampling, Shard
    from fleet.contracts.targets import TargetArgs
    from fleet.results.packed import PackSink
    from fleet.results.staging import Staging
    from fleet.run.manifest import Manifest


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
    @property
    def build(self) -> tuple[TargetArgs, ModelSpec, Sampling] | None: ...


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
class ShardFiles:
    """A shard an actor stored itself (fleet/results/direct.py) or encoded (fleet/results/packed.py),
    for the driver to commit."""

    written: Written | Packed
    then: Callable[[], None] | None = None  # as ShardRows.then


@dataclass(frozen=True)
class Effects:
    """What should follow one call's result, or its being given up. Empty: nothing."""

    provenance: dict[str, str] | None = None  # what the target's engine runs
    smoked: bool = False  # the target's smoke checks ran: a later actor of it does not repeat them
    writes: tuple[Write, ...] = ()  # stored at once, in this order
    shard: ShardRows | None = None  # stored on a writer thread; counts as progress once written
    committed: ShardFiles | None = None  # stored or encoded by an actor: committed on a writer thread, as `shard`
    staged: tuple[Shard, str] | None = None  # a candidate shard an actor staged (its weights): to score
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

    def starts_client_actors(self) -> bool:
        """Whether the call starts Ray actors of its own beside its target's (a perf level's load
        clients), which need CPUs that actors kept idle would hold."""
        return False

    @abstractmethod
    def submit(self, slot: SlotView) -> tuple[Any, float]:
        """Send the call to the slot's actor: its object ref and the seconds it may take."""

    @abstractmethod
    def on_result(self, slot: SlotView, result: Any) -> Effects:
        """What should follow the call's result: rows to store, work for the reference, failures."""

    @abstractmethod
    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        """What should follow its not being done: its last attempt failed, or its target did."""


@dataclass(frozen=True)
class Generate(Work):
    """A shard's prompts through the target; a candidate's rows then go to the reference to score.
    The actor stores them itself (`DirectSink`) and only says where, or encodes them (`PackSink`)
    for the driver to store."""

    shard: Shard
    sink: DirectSink | PackSink = field(compare=False, repr=False)

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        return slot.handle.generate_to.remote(self.shard, self.sink), slot.manifest.run.shard_timeout_s

    def on_result(self, slot: SlotView, result: Written | Packed) -> Effects:
        failed = f"non-finite logprobs in shard {self.shard.shard_id}" if result.non_finite else None
        if isinstance(result, Written):  # stored by the actor: the reference's ready to commit
            if result.files:
                return Effects(committed=ShardFiles(result), target_failed=failed)
            return Effects(staged=(self.shard, result.weights), target_failed=failed)
        if result.whole:  # encoded by the actor: the reference's, to commit
            return Effects(committed=ShardFiles(result), target_failed=failed)
        return Effects(score=Score(self.shard, result, sink=self.sink), target_failed=failed)

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        return Effects(failed_shard=(self.shard.shard_id, reason), progress=1)


@dataclass(frozen=True)
class Score(Work):
    """A candidate's shard scored by the reference (teacher forcing), then written with its columns.
    Rows its actor encoded (`Packed`) go to the reference's actor whole, which scores, joins,
    summarises and encodes them there (fleet/results/packed.py): the driver only stores the bytes."""

    shard: Shard
    gen: Generation | Packed  # the candidate's rows
    sink: DirectSink | PackSink | None = field(default=None, compare=False, repr=False, kw_only=True)  # the Packed's

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        options = _score_options(slot.manifest, self.shard)
        if isinstance(self.gen, Packed):
            return slot.handle.score_stored.remote(self.sink, self.gen, **options), slot.manifest.run.shard_timeout_s
        return slot.handle.score.remote(self.gen.requests, **options), slot.manifest.run.shard_timeout_s

    def on_result(self, slot: SlotView, result: pa.Table | Packed) -> Effects:
        if isinstance(result, Packed):
            return Effects(committed=ShardFiles(result))
        return Effects(shard=ShardRows(self.rows, join_scores(self.rows.tokens, result)))

    @property
    def rows(self) -> Generation:
        """The candidate's rows as tables (an encoded shard's read back: it is not stored as encoded)."""
        return self.gen.generation() if isinstance(self.gen, Packed) else self.gen

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        # The candidate's own rows stand; record that they lack the reference's columns.
        return Effects(shard=self.unscored, failed_shard=(self.shard.shard_id, f"unscored: {reason}"))

    @property
    def unscored(self) -> ShardRows:
        """The candidate's own rows, without the reference's columns."""
        rows = self.rows
        return ShardRows(rows, rows.tokens)

    # Taking turns, its rows wait for the reference on disk (fleet/results/staging.py); False: in
    # the reference's queue, for its next turn (a few rows, nothing a resume needs).
    staged: ClassVar[bool] = True

    def without_reference(self) -> Effects:
        """What is written when no reference is left to score with: the rows, unscored."""
        return Effects(shard=self.unscored)


@dataclass(frozen=True)
class ScoreStaged(Work):
    """A candidate's shard generated while the reference was down (its model's targets take
    turns, or its actor stored it itself), scored from its stored rows (fleet/results/staging.py),
    which go once it is committed. The reference's actor reads them itself (`DirectSink`), or is
    handed their files' bytes, read when the call is sent (`PackSink`); either way it scores and
    stores or encodes the shard, and the driver holds none of its rows in between, however many
    shards wait. Without a sink it is only ever written unscored (`unscored`)."""

    shard: Shard
    weights: str  # what its rows are staged under
    staging: Staging = field(compare=False, repr=False)
    sink: DirectSink | PackSink | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return "score"

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        assert self.sink is not None, "a staged shard without a sink is only written unscored"
        shard_id, weights = self.shard.shard_id, self.weights
        stored = (shard_id, weights) if isinstance(self.sink, DirectSink) else self.staging.packed(shard_id, weights)
        call = slot.handle.score_stored.remote(self.sink, stored, **_score_options(slot.manifest, self.shard))
        return call, slot.manifest.run.shard_timeout_s

    def on_result(self, slot: SlotView, result: Written | Packed) -> Effects:
        return Effects(committed=ShardFiles(result, then=self._drop))

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        # The candidate's own rows stand; record that they lack the reference's columns.
        return Effects(shard=self.unscored, failed_shard=(self.shard.shard_id, f"unscored: {reason}"))

    @property
    def unscored(self) -> ShardRows:
        """Its stored rows without the reference's columns (there is no reference to score them)."""
        gen = self.staging.get(self.shard.shard_id, self.weights)
        return ShardRows(gen, gen.tokens, then=self._drop)

    def _drop(self) -> None:
        self.staging.drop(self.shard.shard_id, self.weights)


def _score_options(manifest: Manifest, shard: Shard) -> dict[str, Any]:
    """The reference's score call's options for a candidate's shard: its top-k, and the precision
    twin's dtype, the candidate's (a model's own dtype beats the target's)."""
    dtype = next(x.dtype for x in manifest.models if x.name == shard.model) or manifest.target(shard.target).dtype
    return {"k": manifest.sampling.logprobs, "twin": dtype if manifest.parity.twin else None}
