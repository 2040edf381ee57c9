"""Dispatching work to the targets' actors, surviving their faults, and gathering Arrow tables.

Per model there is one actor per target (an `ActorSlot`, fleet/run/slots.py), fed one call (a
`Work`, fleet/run/work.py) at a time so that a timeout names exactly one shard. Every target
generates its shards; each candidate shard is then scored by the reference actor (teacher
forcing) and written with the reference's columns joined on.

Models run concurrently: a model is admitted when the cluster has room for its reservation (all
its targets at once if the cluster could ever hold them, else the reference plus the largest
candidate, with candidates taking turns). The reference stays up until every candidate shard is
scored; a candidate's actor is released as soon as its shards are generated. Where a candidate
cannot run beside the reference at all, the reference takes turns with the candidates too: their
shards are staged (fleet/results/staging.py) and scored when the reference's turn comes
(AdmittedModel, fleet/run/slots.py).

A released actor whose engine shut down cleanly is kept for the next target of the same shape,
which builds its engine in that process (fleet/run/idle_actors.py: a new process's imports cost
more than a small engine).

Faults: a call that fails or outlives its timeout gets its actor replaced (engine processes go
with it) and the shard retried, up to `run.max_attempts`; then the shard is recorded as failed
and the run goes on. A target whose actor cannot start fails as a whole, as does one that no live
node can hold any more, once it has waited a while for a node to join (fleet/run/lost_room.py).
A run whose Ray head stops answering ends, resumable (fleet/run/head_watch.py), as does one whose
results store refuses an actor's write (a StoreError, as when it refuses the driver's).

A `Work` item says what should follow its result or its abandonment (`Effects`); the loop hands
every ended call to fleet/run/follow_up.py, the one place that applies it: rows stored, work
queued, failures and progress recorded.
"""

from __future__ import annotations

import functools
import math
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fleet.contracts.errors import StoreError
from fleet.results.direct import DirectSink, actor_env
from fleet.results.packed import PackSink
from fleet.results.staging import Staging
from fleet.results.store import now
from fleet.run import idle_actors
from fleet.run.follow_up import FollowUp
from fleet.run.head_watch import watching
from fleet.run.lost_room import CHECK_EVERY_S, GRACE_S, LostRoom, unplaceable
from fleet.run.outcome import GateCheck, Outcome, Verdicts
from fleet.run.placement import fits, reservation, turns_note
from fleet.run.slots import ActorSlot, AdmittedModel
from fleet.run.work import Generate
from fleet.run.writer import ShardWriter

if TYPE_CHECKING:
    from fleet.results.store import RunStore
    from fleet.run.manifest import Manifest
    from fleet.run.plan import ModelPlan
    from fleet.run.progress import Progress
    from fleet.run.work import Work


class Loop:
    """The dispatch loop: admits models, feeds their slots, retries or gives up failed calls, and
    hands what each `Work` says should follow its result or its abandonment to `FollowUp`."""

    def __init__(
        self,
        manifest: Manifest,
        plans: Sequence[ModelPlan],
        store: RunStore,
        bar: Progress,
        *,
        cluster: dict[str, float],
        gates_of: GateCheck | None = None,
        sink: DirectSink | PackSink | None = None,
    ) -> None:
        """`gates_of` is what `after:` checks beside failures (None: failures only). `sink`: the
        actors store their shards themselves (`DirectSink`) or encode them (`PackSink`, the
        default), and the loop commits them."""
        self.manifest, self.bar, self.outcome = manifest, bar, Outcome()
        self.reservation = reservation(manifest, cluster)
        self.free = dict(cluster)
        self.staging, note = Staging(store), turns_note(manifest, cluster)
        if note is not None:
            bar.write(note)
        self.store, self.writer = store, ShardWriter(store, bar)
        # `after:` asks whether a target passed; its gates read its rows once they are on disk.
        verdicts = Verdicts(self.outcome, gates_of, rows_stored=self.writer.wait)
        # Shards a killed run staged: scored now, not generated again (the rest of the area goes).
        staged = self.staging.recover({s.shard_id for plan in plans for s in plan.shards})
        # A released actor waits for the next target of its shape (run.keep_actors).
        self.idle, self.owns_idle = idle_actors.for_run(manifest.run.keep_actors)
        self.waiting = deque(
            AdmittedModel(
                manifest.model(plan.model),
                plan,
                manifest,
                reservation=self.reservation,
                not_passed=functools.partial(verdicts.not_passed, plan.model),
                take_turns=note is not None,
                staging=self.staging,
                staged=staged,
                sink=sink or PackSink(store.run_id, manifest.reference),
                env=actor_env(store) if isinstance(sink, DirectSink) else None,
                idle=self.idle,
            )
            for plan in plans
            if plan
        )
        self.active: list[AdmittedModel] = []
        self.calls: dict[Any, tuple[AdmittedModel, str]] = {}
        self.follow_up = FollowUp(self.outcome, store=store, writer=self.writer, staging=self.staging, bar=bar)
        self.lost_room = LostRoom(min(GRACE_S, manifest.run.start_timeout_s / 2))

    def run(self) -> Outcome:
        """Run every model's plan: its shards, probes and perf levels (retrying faults); write what
        they produce; returns what failed. A lost Ray head ends the process (fleet/run/head_watch.py)."""
        with watching(self.store, self.bar.write):
            return self._run()

    def _run(self) -> Outcome:
        import ray

        finished = False
        try:
            while self.waiting or self.active:
                self._admit()
                self._submit()
                if not self.calls:  # nothing in flight: every active model must have finished
                    self._retire()
                    if self.active:
                        msg = f"scheduler stalled with {[r.model.name for r in self.active]} unfinished"
                        raise RuntimeError(msg)
                    continue
                deadline = min(admitted.slots[name].current[2] for admitted, name in self.calls.values())  # type: ignore[index]
                wait = max(0.0, deadline - time.monotonic())
                if self._check_room():  # an actor waiting for room: is there still a node for it?
                    wait = min(wait, CHECK_EVERY_S)
                done, _ = ray.wait(list(self.calls), num_returns=1, timeout=None if wait == math.inf else wait)
                if done:
                    self._handle(done[0])
                else:
                    self._expire()
                self._retire()
            finished = True
        finally:
            for admitted in self.active:
                for slot in admitted.slots.values():
                    slot.stop()
            if self.idle is not None and (self.owns_idle or not finished):
                self.idle.clear()
            self.writer.stop()
        self.writer.wait()
        self.staging.tidy()
        return self.outcome

    def _submit(self) -> None:
        """Send each idle actor its next call, except around a CPU perf level, which runs alone:
        while one waits, nothing new starts; once the calls in flight drain, it runs by itself."""
        slots = [
            (admitted, name, slot) for admitted in self.active for name, slot in admitted.slots.items() if slot.handle
        ]
        if any(s.current is not None and s.runs_alone(s.current[1]) for *_, s in slots):
            return
        held = any(s.current is None and s.exclusive_next for *_, s in slots)
        for admitted, name, slot in slots:
            if slot.current is not None or not slot.queue or (held and not slot.exclusive_next):
                continue
            if slot.exclusive_next and self.calls:
                continue
            if name != admitted.ref and admitted.scoring_backlog and isinstance(slot.queue[0], Generate):
                continue
            if (call := slot.submit()) is not None:
                self.calls[call] = (admitted, name)
                if slot.current is not None and slot.runs_alone(slot.current[1]):
                    return

    def _admit(self) -> None:
        while self.waiting and (not self.active or fits(self.reservation, self.free)):
            admitted = self.waiting.popleft()
            self.free = {k: self.free.get(k, 0.0) - admitted.reservation.get(k, 0.0) for k in self.free}
            self.outcome.timeline[admitted.model.name] = {"admitted_at": now()}
            self.bar.started_model(admitted.model.name)
            admitted.start()
            self.active.append(admitted)

    def _give_up(
        self, admitted: AdmittedModel, name: str, reason: str, *, failed: bool, work: Sequence[Work] = ()
    ) -> None:
        """Target `name` runs no more: it failed, or `after:` skipped it. It is recorded as failing,
        and `work` with everything it had queued as not done."""
        slot, key = admitted.slots[name], f"{admitted.model.name}/{name}"
        self.outcome.failures.setdefault(key, reason)
        admitted.reference_failed = admitted.reference_failed or (failed and name == admitted.ref)
        self.bar.write(f"{'FAILED' if failed else 'SKIPPED'} {key}: {reason}")
        for w in [*work, *slot.queue, *slot.perf_todo]:
            self.follow_up.abandon(admitted, name, w, f"target failed: {reason}" if failed else reason)
        slot.queue.clear()
        slot.perf_todo.clear()

    def _retire(self) -> None:
        for admitted in self.active:
            for name, reason in admitted.take_skipped():
                self._give_up(admitted, name, reason, failed=False)
        for admitted in [r for r in self.active if r.done]:
            self.active.remove(admitted)
            self.free = {k: v + admitted.reservation.get(k, 0.0) for k, v in self.free.items()}
            self.outcome.timeline[admitted.model.name]["finished_at"] = now()

    def _expire(self) -> None:
        """A call past its deadline: kill the actor; the call then fails and takes the retry path."""
        now = time.monotonic()
        for admitted, name in list(self.calls.values()):
            slot = admitted.slots[name]
            if slot.current is not None and slot.current[2] <= now and slot.handle is not None:
                self.bar.write(f"timeout: {admitted.model.name}/{name} {slot.current[1].label}; replacing the actor")
                self._kill(slot)

    @staticmethod
    def _kill(slot: ActorSlot) -> None:
        """Kill the slot's actor; its call then fails and takes the retry (or give-up) path."""
        import ray

        ray.kill(slot.handle, no_restart=True)
        slot.current = (slot.current[0], slot.current[1], math.inf)  # type: ignore[index]  # wait for the error now

    def _starting(self) -> dict[str, tuple[AdmittedModel, str]]:
        """The slots whose actor is starting (its Describe in flight), by target key."""
        calls = self.calls.values()
        return {f"{a.model.name}/{n}": (a, n) for a, n in calls if a.slots[n].current[1].starts_actor}  # type: ignore[index]

    def _check_room(self) -> bool:
        """Stop the starting actor of a target that no live node could hold for the grace period
        (fleet/run/lost_room.py); its Describe then fails, and with it the target. Whether any
        actor is starting (then the loop checks again soon)."""
        starting = self._starting()
        for key in self.lost_room.homeless({k: a.slots[n].target for k, (a, n) in starting.items()}, self.bar.write):
            admitted, name = starting[key]
            self._kill(admitted.slots[name])
        return bool(starting)

    def _handle(self, call: Any) -> None:
        import ray

        admitted, name = self.calls.pop(call)
        slot = admitted.slots[name]
        assert slot.current is not None
        _, work, _ = slot.current
        slot.current = None
        try:
            result = ray.get(call)
        except Exception as e:  # noqa: BLE001  (any actor, engine or task error: retry or record)
            refused = getattr(e, "cause", None)  # Ray's wrapper of the actor's exception
            if isinstance(refused, StoreError):
                # The store refused an actor's write (run.write: actors): no engine's fault, and
                # every retry, each on a new engine, would meet it again. The run stops resumable.
                raise refused from None
            self._failed(admitted, name, work, _reason(e))
        else:
            # Describe answered: the engine is up (a later failure is then a call's, not the target's).
            slot.alive = slot.alive or work.starts_actor
            self.follow_up.apply(admitted, name, work, work.on_result(slot, result))
            self._maybe_release(admitted, name)
        # A scored shard or a reference shard may be what an `after:` target waited for.
        admitted.start_waiting()
        self._maybe_release(admitted, admitted.ref)

    def _maybe_release(self, admitted: AdmittedModel, name: str) -> None:
        """Release a candidate once its parity work is done, the reference once all candidates'
        scoring is done; each first runs its perf levels, so they never overlap its own parity work."""
        if name != admitted.ref and admitted.idle(name) and name in admitted.running:
            self._release_or_perf(admitted, name)
        if admitted.ref in admitted.running and admitted.idle(admitted.ref):
            if admitted.candidates_done:
                self._release_or_perf(admitted, admitted.ref)
            elif admitted.take_turns:
                admitted.release(admitted.ref)  # its turn is over: candidates go next; its perf levels at its last turn

    def _release_or_perf(self, admitted: AdmittedModel, name: str) -> None:
        slot = admitted.slots[name]
        if slot.perf_todo and slot.handle is not None:
            slot.queue.extend(slot.perf_todo)
            slot.perf_todo.clear()
        else:
            admitted.release(name)

    def _failed(self, admitted: AdmittedModel, name: str, work: Work, reason: str) -> None:
        slot, key = admitted.slots[name], f"{admitted.model.name}/{name}"
        if work.starts_actor and slot.build is not None:
            # A kept actor's process, not the target, may be what failed (its node went while it
            # waited): the target's engine is built once more in a new actor before it counts.
            slot.stop()
            slot.launch(reuse=False)
            return
        if work.starts_actor or not slot.alive:
            # The actor could not start (the model does not load, no such device, its node was lost
            # and no other has room...): the whole target fails; its candidates' rows are written
            # unscored if it was the reference.
            if work.starts_actor:
                reason = unplaceable(slot.target) or reason
            self._give_up(admitted, name, reason, failed=True, work=[work])
            admitted.release(name)
            for n in list(admitted.running):
                self._maybe_release(admitted, n)
            return
        slot.stop()
        if work.attempt < self.manifest.run.max_attempts:
            self.outcome.retries += 1
            self.bar.write(f"retry {work.attempt + 1}/{self.manifest.run.max_attempts} {key} {work.label}: {reason}")
            slot.queue.appendleft(work.retried())
        else:
            self.follow_up.abandon(admitted, name, work, reason)
        # A fresh actor also for perf levels still to run, and for a reference still to score with.
        if admitted.needs(name):
            slot.launch()
        else:
            admitted.release(name)
        self._maybe_release(admitted, name)


def _reason(error: Exception) -> str:
    text = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    # Ray wraps the remote traceback; its last line is the actual error.
    return (text[-1] if text else type(error).__name__)[:500]
