"""Perf levels on the driver's side: one concurrency level of a perf scenario (`Perf`), and,
when its scenario carries `parity:`, its parity rows (actors/load_parity.py) scored by the
reference like a candidate shard, then written with the level's perf rows (`ScoreLoad`).

`ScoreLoad` is a `Score` (fleet/run/work.py): it goes to the reference's queue the way a
candidate shard does, with the precision twin, and the scheduler counts it among the rows a
target's gates wait for. What differs is where its rows go: the load tables
(perf_schema.LOAD_TABLES) keyed by scenario and level, and the level's perf rows with them,
its perf_levels row last, so a level is done (for `--resume`) only once its parity rows are
stored, scored or not. Taking turns, it waits in the reference's queue for its next turn rather
than on disk: a level's parity rows are a few prompts, and a resume runs the level again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from fleet.contracts.engine import Generation
from fleet.contracts.perf_schema import LOAD_TOKENS
from fleet.contracts.spec import Shard
from fleet.results.scores import join_scores
from fleet.run.work import Effects, Score, Work, Write

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet.contracts.engine import PerfResult
    from fleet.run.plan import PerfLevel
    from fleet.run.work import SlotView


@dataclass(frozen=True)
class Perf(Work):
    """One concurrency level of a perf scenario; a target's levels run after its parity work."""

    level: PerfLevel
    alone_on_cpu: ClassVar[bool] = True

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        scenario, m = self.level.scenario, slot.manifest
        prompts = m.prompt_list(scenario.prompt_set) if scenario.prompt_set else None
        parity = m.prompt_list(scenario.parity.prompt_set) if scenario.parity else None
        return slot.handle.perf.remote(scenario, self.level.level, prompts, parity), m.run.shard_timeout_s

    def starts_client_actors(self) -> bool:
        return self.level.scenario.client_actor_cpus > 0

    def on_result(self, slot: SlotView, result: PerfResult) -> Effects:
        if result.parity is not None:  # written once the reference has scored its parity rows
            return Effects(score=ScoreLoad.of(self.level, result))
        return Effects(writes=perf_writes(self.level.key, result), progress=1)

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        return Effects(failed_shard=(self.level.key, reason), progress=1)


def perf_writes(key: str, result: PerfResult) -> tuple[Write, ...]:
    """A level's perf rows; its perf_levels row goes last: it marks the level done (resume)."""
    return Write("perf_requests", key, result.requests), Write("perf_levels", key, result.level)


@dataclass(frozen=True)
class ScoreLoad(Score):
    """A perf level's parity rows, alone and under load, teacher-forced by the reference."""

    level: PerfLevel
    perf: PerfResult
    staged: ClassVar[bool] = False

    @classmethod
    def of(cls, level: PerfLevel, perf: PerfResult) -> ScoreLoad:
        """The scoring of `perf`'s parity rows. A prompt is sent twice (solo and load), so the
        reference sees it under a key of its own, `<phase>/<prompt id>` (`_scored` undoes it)."""
        import polars as pl

        assert perf.parity is not None
        key = pl.concat_str("phase", pl.lit("/"), "prompt_id").alias("prompt_id")
        requests = pl.from_arrow(perf.parity.requests).with_columns(key).to_arrow()  # type: ignore[union-attr]
        tokens = pl.from_arrow(perf.parity.tokens).with_columns(key).to_arrow()  # type: ignore[union-attr]
        shard = Shard(level.model, level.target, level.scenario.name, level.level, ())
        return cls(shard, Generation(requests, tokens, perf.level), level=level, perf=perf)

    def on_result(self, slot: SlotView, result: pa.Table) -> Effects:
        return Effects(writes=self._writes(join_scores(self.rows.tokens, result, into=LOAD_TOKENS)), progress=1)

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        why = f"parity under load unscored: {reason}"
        return Effects(writes=self._writes(None), failed_shard=(self.level.key, why), progress=1)

    def without_reference(self) -> Effects:
        return Effects(writes=self._writes(None), progress=1)

    def _writes(self, scored: pa.Table | None) -> tuple[Write, ...]:
        """The level's rows: perf requests, the parity rows (`scored`, or as generated), perf_levels last."""
        import polars as pl

        from fleet.contracts import schema

        assert self.perf.parity is not None
        if scored is None:
            tokens: Any = self.perf.parity.tokens
        else:
            own_id = pl.col("prompt_id").str.replace(r"^(solo|load)/", "")
            tokens = schema.conform(pl.from_arrow(scored).with_columns(own_id).to_arrow(), LOAD_TOKENS)  # type: ignore[union-attr]
        key = self.level.key
        requests, level = perf_writes(key, self.perf)
        parity = (Write("load_requests", key, self.perf.parity.requests), Write("load_tokens", key, tokens))
        return requests, *parity, level
