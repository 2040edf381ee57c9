"""What follows a call, carried out: a `Work`'s `Effects` (fleet/run/work.py) once its result is
in or it was given up. Rows are stored (at once, or on the writer's threads), a candidate's shard
goes to the reference to score (held in memory, or staged on disk when the model's targets take
turns), and failures, provenance and progress are recorded in the run's `Outcome`.

Work only says what should follow; the dispatch loop (fleet/run/scheduler.py) hands every ended
call here, the one place its `Effects` are applied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.run.work import ScoreStaged

if TYPE_CHECKING:
    from fleet.contracts.spec import Shard
    from fleet.results.staging import Staging
    from fleet.results.store import RunStore
    from fleet.run.outcome import Outcome
    from fleet.run.progress import Progress
    from fleet.run.slots import AdmittedModel
    from fleet.run.work import Effects, Score, Work
    from fleet.run.writer import ShardWriter


class FollowUp:
    """Carries out each ended call's `Effects` into the run's store, writer, staging area and outcome."""

    def __init__(
        self, outcome: Outcome, *, store: RunStore, writer: ShardWriter, staging: Staging, bar: Progress
    ) -> None:
        self.outcome, self.store, self.writer, self.staging, self.bar = outcome, store, writer, staging, bar

    def abandon(self, admitted: AdmittedModel, name: str, work: Work, reason: str) -> None:
        """`work` on target `name` is not done: its last attempt failed, or its target did."""
        self.apply(admitted, name, work, work.on_abandon(admitted.slots[name], reason))

    def apply(self, admitted: AdmittedModel, name: str, work: Work, effects: Effects) -> None:
        """Carry out what should follow `work` on target `name`, which has ended (its result is
        in, or it was given up): the one place work changes the admitted."""
        admitted.ended(work)
        self._carry_out(admitted, name, effects)

    def _carry_out(self, admitted: AdmittedModel, name: str, effects: Effects) -> None:
        key, slot = f"{admitted.model.name}/{name}", admitted.slots[name]
        if effects.provenance is not None:
            self.outcome.provenance[key] = effects.provenance
        slot.smoked = slot.smoked or effects.smoked
        if effects.target_failed is not None:
            self.outcome.failures.setdefault(key, effects.target_failed)
        if effects.failed_shard is not None:
            self.outcome.failed_shards.setdefault(*effects.failed_shard)
        for write in effects.writes:
            self.store.write(write.table, write.key, write.rows)
        if effects.score is not None:
            self._to_reference(admitted, effects.score)
        if effects.staged is not None:
            self._staged_to_reference(admitted, *effects.staged)
        if effects.shard is not None:
            self.writer.write(effects.shard)
        if effects.committed is not None:
            self.writer.commit(effects.committed)
        if effects.progress:
            self.bar.update(effects.progress, model=admitted.model.name)
        if admitted.take_turns:
            self.bar.staged(admitted.model.name, admitted.staged_waiting)

    def _to_reference(self, admitted: AdmittedModel, score: Score) -> None:
        """A candidate's shard goes to the reference: held in memory for it while it is up beside
        the candidates; staged on disk when the model takes turns (the candidate's actor may go once
        they are stored); written unscored when there is no reference (left) to score with."""
        if admitted.take_turns and not admitted.reference_failed and score.staged:
            admitted.stage(score.shard, self.staging.put(score.gen))
        elif not admitted.to_score(score):
            self._carry_out(admitted, score.shard.target, score.without_reference())

    def _staged_to_reference(self, admitted: AdmittedModel, shard: Shard, weights: str) -> None:
        """A candidate's shard its actor staged goes to the reference as `_to_reference` says: to
        score from the staging area, or, with no reference left, committed unscored."""
        if admitted.take_turns and not admitted.reference_failed:
            admitted.stage(shard, weights)
        elif admitted.slots[admitted.ref].handle is not None:
            admitted.stage(shard, weights, first=True)
        else:
            self.writer.write(ScoreStaged(shard, weights, self.staging).unscored)
