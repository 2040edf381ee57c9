"""The scheduler's view of the actors: an `ActorSlot` is the driver's handle on one target's
`TargetActor` (actors/target_actor.py) for one model, fed one call (a `Work`, fleet/run/work.py)
at a time; an `AdmittedModel` is one model's slots, started and released as the work and the model's
share of the cluster allow."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleet.run.drill import Drill
from fleet.run.idle_actors import IdleActors, free_ray, shape
from fleet.run.perf_work import Perf
from fleet.run.placement import add, engines, fits, footprint, reserve
from fleet.run.target_work import Describe, Probe, Smoke
from fleet.run.work import Generate, Score, ScoreStaged, Work

if TYPE_CHECKING:
    from fleet.contracts.spec import ModelSpec, Sampling, Shard
    from fleet.contracts.targets import TargetArgs
    from fleet.results.direct import DirectSink
    from fleet.results.packed import PackSink
    from fleet.results.staging import Staging
    from fleet.run.manifest import Manifest
    from fleet.run.plan import ModelPlan

# Candidate shards a model may hold in the driver unscored: this bounds the driver's memory.
MAX_UNSCORED = 8
# Environment every actor gets: no phoning home, from vLLM or Ray.
BASE_ENV = {"VLLM_NO_USAGE_STATS": "1", "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}


class ActorSlot:
    """The driver's handle on one target's TargetActor for one model, fed one call at a time."""

    def __init__(
        self,
        target: TargetArgs,
        model: ModelSpec,
        manifest: Manifest,
        *,
        env: dict[str, str] | None = None,
        idle: IdleActors | None = None,
    ) -> None:
        self.target, self.model, self.manifest = target, model, manifest
        self.env = env or {}  # beside the target's own: what writing to the results store needs
        self.idle = idle  # actors kept between targets (fleet/run/idle_actors.py); None: none kept
        self.shape: str | None = None  # the current actor's, when it may be kept
        self.build: tuple[TargetArgs, ModelSpec, Sampling] | None = None  # for a kept actor's Describe
        self.queue: deque[Work] = deque()
        self.current: tuple[Any, Work, float] | None = None  # (object ref, work, deadline)
        self.handle: Any = None
        self.pg: Any = None
        self.alive = False  # describe succeeded on the current actor
        self.smoked = False  # smoke checks run once per target, on its first actor
        self.perf_todo: list[Work] = []  # perf levels, queued once the parity work is done

    @property
    def exclusive_next(self) -> bool:
        """The next call is a perf level on CPU: timings are only honest with the cores to itself."""
        return bool(self.queue) and self.runs_alone(self.queue[0])

    def runs_alone(self, work: Work) -> bool:
        return work.alone_on_cpu and self.target.device == "cpu"

    def launch(self, *, reuse: bool = True) -> None:
        """Start the target's actor (`reuse`: or take a kept one of its shape) and queue its Describe."""
        import ray

        from fleet.contracts.backends import TARGET_ACTOR, engine_side

        if self.target.cards > 1:
            free_ray()  # a multi-card engine reuses none, and its placement group needs what they hold
        self.pg, options = reserve(self.target)
        options["runtime_env"] = {"env_vars": BASE_ENV | self.env | self.target.actor_env()}
        self.shape = shape(options) if self.idle is not None and self.pg is None else None
        kept = self.idle.take(self.shape) if reuse and self.idle is not None and self.shape is not None else None
        if kept is not None:  # its Describe builds this target's engine first
            self.handle, self.build = kept, (self.target, self.model, self.manifest.sampling)
        else:
            self.handle, self.build = (
                (
                    ray.remote(engine_side(TARGET_ACTOR))
                    .options(**options)
                    .remote(self.target, self.model, self.manifest.sampling)
                ),
                None,
            )
        self.alive = False
        if self.target.can("smoke") and not self.smoked:
            self.queue.appendleft(Smoke())
        self.queue.appendleft(Describe())

    def submit(self) -> Any | None:
        """Send the next queued call if none is in flight; returns its object ref."""
        if self.current is not None or not self.queue or self.handle is None:
            return None
        work = self.queue.popleft()
        if work.starts_client_actors():
            free_ray()  # actors kept idle (this run's, or an across_runs() block's) would hold their CPUs
        call, timeout = work.submit(self)
        self.current = (call, work, time.monotonic() + timeout)
        return call

    def stop(self, *, keep: bool = False) -> None:
        """Shut the engine down (its child processes with it), then the actor, then its cards.
        `keep`: an actor whose engine answered and shut down cleanly waits for the next target of
        its shape instead (fleet/run/idle_actors.py)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.handle is not None:
            clean = False
            with contextlib.suppress(Exception):  # a dead actor has nothing left to shut down
                ray.get(self.handle.shutdown.remote(), timeout=60)
                clean = True
            if keep and clean and self.alive and self.idle is not None and self.shape is not None:
                self.idle.keep(self.shape, self.handle)
            else:
                ray.kill(self.handle, no_restart=True)
        if self.pg is not None:
            remove_placement_group(self.pg)
        self.handle = self.pg = self.current = self.shape = self.build = None
        self.alive = False


class AdmittedModel:
    """One model: its slots, the shards still to generate, and scoring by the reference.

    When its targets take turns (`take_turns`, fleet/run/placement.py), the reference and the
    candidates never hold resources at once: candidates run (as many as the reservation holds),
    their shards staged (fleet/results/staging.py); when none can run, since none is left or the
    next waits on an `after:` target's rows still to be scored, the reference takes its turn: it
    generates its own shards and scores every staged one, then makes way again."""

    def __init__(
        self,
        model: ModelSpec,
        plan: ModelPlan,
        manifest: Manifest,
        *,
        reservation: dict[str, float],
        not_passed: Callable[[str], str | None] = lambda target: None,
        take_turns: bool = False,
        staging: Staging | None = None,
        staged: dict[str, str] | None = None,
        sink: DirectSink | PackSink,
        env: dict[str, str] | None = None,
        idle: IdleActors | None = None,
    ) -> None:
        """`staged`: shards (id -> weights) generated and staged before a resume: only scored now.
        `sink`: the actors store their rows themselves (fleet/results/direct.py) or encode them
        (fleet/results/packed.py); `env`: what they need to store them.
        `idle`: actors kept between targets, shared by the run's models."""
        self.model, self.manifest, self.reservation = model, manifest, reservation
        self.engines = engines(manifest, reservation)  # what its targets may hold: not its clients' CPUs
        self.take_turns, self.staging, self.sink = take_turns, staging, sink
        self.reference_failed = False  # its actor could not start: candidates' rows stay unscored
        # Why target `name` of this model did not pass (None: it did): what `after:` waits on. It is
        # asked once `name` has finished and every row of it is scored: its gates read them.
        self.not_passed = not_passed
        self.skipped: dict[str, str] = {}  # target -> why it was not run (`after:` did not pass)
        self.ref = manifest.reference
        self.slots = {t.name: ActorSlot(t, model, manifest, env=env, idle=idle) for t in manifest.targets}
        self.staged_waiting = 0  # staged candidate shards queued for the reference or being scored
        for shard in plan.shards:
            if staged and shard.shard_id in staged:
                self.stage(shard, staged[shard.shard_id])
            else:
                self.slots[shard.target].queue.append(Generate(shard, sink=sink))
        for probe in plan.probes:
            self.slots[probe.target].queue.append(Probe(probe))
        for call in plan.drills:
            self.slots[call.target].queue.append(Drill(call))
        for level in plan.perf:
            self.slots[level.target].perf_todo.append(Perf(level))
        # Targets with nothing to do (all done, e.g. on resume) never start; smoke checks are work
        # too (a dummy-weight server's only job can be its smoke gate, 003's Stage A).
        self.waiting = deque(
            n for n, s in self.slots.items() if (s.queue or s.perf_todo or s.target.can("smoke")) and n != self.ref
        )
        self.running: set[str] = set()
        self.unscored = 0  # candidate shards generated and not yet scored: held in the driver
        self._handed: set[str] = set()

    def to_score(self, score: Score) -> bool:
        """Queue a candidate's rows for the reference to score; False when it is gone (failed).
        Taking turns, rows not staged on disk (`Score.staged`) wait here for its next turn."""
        ref = self.slots[self.ref]
        if ref.handle is None and not (self.take_turns and not self.reference_failed):
            return False
        # Scored before the reference's own next shard: a candidate's rows wait in the driver
        # only until the reference is free, so memory does not grow with the prompt count.
        ahead = (i for i, w in enumerate(ref.queue) if not isinstance(w, Describe | Smoke | Score))
        ref.queue.insert(next(ahead, len(ref.queue)), score)
        self.unscored += 1
        return True

    def stage(self, shard: Shard, weights: str, *, first: bool = False) -> None:
        """Queue a staged candidate shard for the reference to score from its stored rows; `first`:
        before the reference's own next shard, so that shards are committed as they come."""
        assert self.staging is not None  # the scheduler stages only with a staging area
        queue, score = self.slots[self.ref].queue, ScoreStaged(shard, weights, self.staging, sink=self.sink)
        ahead = (i for i, w in enumerate(queue) if not isinstance(w, Describe | Smoke | Score | ScoreStaged))
        queue.insert(next(ahead, len(queue)) if first else len(queue), score)
        self.staged_waiting += 1

    def ended(self, work: Work) -> None:
        """`work` is done or given up: a Score's rows are no longer held for the reference, a
        staged shard no longer waits for it."""
        if isinstance(work, Score):
            self.unscored -= 1
        elif isinstance(work, ScoreStaged):
            self.staged_waiting -= 1

    @property
    def scoring_backlog(self) -> bool:
        """Enough candidate rows wait for the reference: candidates generate no more until it catches up."""
        return self.unscored >= MAX_UNSCORED and self.slots[self.ref].handle is not None

    def start(self) -> None:
        if not self.take_turns and any(s.queue or s.perf_todo for s in self.slots.values()):
            self._launch(self.ref)
        self._start_candidates()

    def _launch(self, name: str) -> None:
        self.slots[name].launch()
        self.running.add(name)

    def _start_candidates(self) -> None:
        if self.take_turns and self.ref in self.running:
            return  # the reference's turn: it holds the model's reservation alone
        while self.waiting:
            held = add(*(footprint(self.slots[n].target) for n in self.running))
            nxt = self.slots[self.waiting[0]].target
            if nxt.after is not None:
                if nxt.after in self.running or self._unsettled(nxt.after):
                    break  # candidates start in manifest order; this one once `after` passed its gates
                why = self.skipped.get(nxt.after) or self.not_passed(nxt.after)
                if why is not None:
                    self.skipped[self.waiting.popleft()] = f"not run: {nxt.after} did not pass ({why})"
                    continue
            if self.running and not fits(add(held, footprint(nxt)), self.engines):
                break
            self._launch(self.waiting.popleft())
        ref = self.slots[self.ref]
        if self.take_turns and not self.running and (ref.queue or ref.perf_todo):
            # No candidate can run: none is left, or the next waits for rows only the reference scores.
            self._launch(self.ref)

    def _unsettled(self, name: str) -> bool:
        """Rows that target `name`'s gates read are still to come: shards of it await the reference's
        scoring, or the reference's own shards (which its sequences are compared with) are not done."""
        ref = self.slots[self.ref]
        pending = [*ref.queue, *([ref.current[1]] if ref.current is not None else [])]
        return any(
            isinstance(w, Generate) or (isinstance(w, Score | ScoreStaged) and w.shard.target == name) for w in pending
        )

    def start_waiting(self) -> None:
        """Start (or skip) candidates that wait, now that some work has ended."""
        self._start_candidates()

    def idle(self, name: str) -> bool:
        slot = self.slots[name]
        return slot.current is None and not slot.queue

    @property
    def candidates_done(self) -> bool:
        """No candidate has parity work left or is yet to start: nothing more comes to be scored."""
        return all(self.idle(n) for n in self.running if n != self.ref) and not self.waiting

    def needs(self, name: str) -> bool:
        """Whether target `name` still has work, or may get some (the reference, to score with)."""
        slot = self.slots[name]
        # Taking turns, the reference's next turn starts it again if candidates leave it work.
        waits = name == self.ref and not self.candidates_done and not self.take_turns
        return bool(slot.queue or slot.perf_todo) or waits

    def take_skipped(self) -> list[tuple[str, str]]:
        """Targets newly skipped by `after:` and why; each is handed out once."""
        out = [(n, why) for n, why in self.skipped.items() if n not in self._handed]
        self._handed.update(n for n, _ in out)
        return out

    def release(self, name: str) -> None:
        self.slots[name].stop(keep=True)
        self.running.discard(name)
        self._start_candidates()

    @property
    def done(self) -> bool:
        return not self.running and not self.waiting
