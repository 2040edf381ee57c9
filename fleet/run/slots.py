"""The scheduler's view of the actors: a `Slot` is one target's actor for one model, fed one
call (`Work`) at a time; a `ModelRun` is one model's slots, started and released as the work and
the model's share of the cluster allow."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet.run.placement import add, fits, need

if TYPE_CHECKING:
    from fleet.contracts.engine import Generation
    from fleet.contracts.spec import ModelSpec, Shard
    from fleet.contracts.targets import TargetArgs
    from fleet.run.manifest import Manifest
    from fleet.run.plan import PerfRun

# Environment every actor gets: no phoning home, from vLLM or Ray.
BASE_ENV = {"VLLM_NO_USAGE_STATS": "1", "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class Work:
    what: str  # "describe" | "smoke" | "generate" | "score" | "perf" | "logits" | "layers" (probes)
    shard: Shard | None = None
    gen: Generation | None = None  # for "score": the candidate's rows
    perf: PerfRun | None = None
    attempt: int = 1


class Slot:
    """One target's actor for one model, fed one call at a time."""

    def __init__(self, target: TargetArgs, model: ModelSpec, manifest: Manifest) -> None:
        self.target, self.model, self.manifest = target, model, manifest
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
        return bool(self.queue) and runs_alone(self.queue[0], self)

    def launch(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from fleet.contracts.targets import TARGET_ACTOR, engine_side

        options: dict[str, Any] = self.target.ray_resources()
        options["runtime_env"] = {"env_vars": BASE_ENV | self.target.actor_env()}
        if self.target.tensor_parallel_size > 1:
            # All tp cards in one bundle on one node, reserved atomically for this engine.
            bundle = need(self.target)
            self.pg = placement_group([bundle], strategy="STRICT_PACK")
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self.pg)
        self.handle = (
            ray.remote(engine_side(TARGET_ACTOR))
            .options(**options)
            .remote(self.target, self.model, self.manifest.sampling)
        )
        self.alive = False
        if self.target.can("smoke") and not self.smoked:
            self.queue.appendleft(Work("smoke"))
        self.queue.appendleft(Work("describe"))

    def submit(self) -> Any | None:
        """Send the next queued call if none is in flight; returns its object ref."""
        if self.current is not None or not self.queue or self.handle is None:
            return None
        work = self.queue.popleft()
        run = self.manifest.run
        if work.what == "describe":
            call, timeout = self.handle.describe.remote(), run.start_timeout_s
        elif work.what == "generate":
            call, timeout = self.handle.generate.remote(work.shard), run.shard_timeout_s
        elif work.what == "smoke":
            call, timeout = self.handle.smoke.remote(), run.shard_timeout_s
        elif work.what in ("logits", "layers"):
            probe = getattr(self.manifest.probes, work.what)
            probe_prompts = self.manifest.prompts[probe.prompt_set]
            method = self.handle.probe_logits if work.what == "logits" else self.handle.probe_layers
            call = method.remote(probe_prompts, prompt_set=probe.prompt_set, positions=probe.positions)
            timeout = run.shard_timeout_s
        elif work.what == "perf":
            assert work.perf is not None
            scenario = work.perf.scenario
            prompts = self.manifest.prompts[scenario.prompt_set] if scenario.prompt_set else None
            call, timeout = self.handle.perf.remote(scenario, work.perf.level, prompts), run.shard_timeout_s
        else:
            assert work.gen is not None
            call = self.handle.score.remote(work.gen.requests, k=self.manifest.sampling.logprobs)
            timeout = run.shard_timeout_s
        self.current = (call, work, time.monotonic() + timeout)
        return call

    def stop(self) -> None:
        """Shut the engine down (its child processes with it), then the actor, then its cards."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.handle is not None:
            with contextlib.suppress(Exception):  # a dead actor has nothing left to shut down
                ray.get(self.handle.shutdown.remote(), timeout=60)
            ray.kill(self.handle, no_restart=True)
        if self.pg is not None:
            remove_placement_group(self.pg)
        self.handle = self.pg = self.current = None
        self.alive = False


class ModelRun:
    """One model: its slots, the shards still to generate, and scoring by the reference."""

    def __init__(
        self,
        model: ModelSpec,
        shards: list[Shard],
        perf: list[PerfRun],
        probes: list[str],
        manifest: Manifest,
        *,
        reservation: dict[str, float],
    ) -> None:
        self.model, self.manifest, self.reservation = model, manifest, reservation
        self.ref = manifest.reference
        self.slots = {t.name: Slot(t, model, manifest) for t in manifest.targets}
        for shard in shards:
            self.slots[shard.target].queue.append(Work("generate", shard))
        for probe_id in probes:  # "model/target/kind"
            _, target, kind = probe_id.split("/")
            self.slots[target].queue.append(Work(kind))
        for level in perf:
            self.slots[level.target].perf_todo.append(Work("perf", perf=level))
        # Targets with nothing to do (all done, e.g. on resume) never start.
        self.waiting = deque(n for n, s in self.slots.items() if (s.queue or s.perf_todo) and n != self.ref)
        self.running: set[str] = set()

    def start(self) -> None:
        if any(s.queue or s.perf_todo for s in self.slots.values()):
            self._launch(self.ref)
        self._start_candidates()

    def _launch(self, name: str) -> None:
        self.slots[name].launch()
        self.running.add(name)

    def _start_candidates(self) -> None:
        while self.waiting:
            held = add(*(need(self.slots[n].target) for n in self.running))
            nxt = self.slots[self.waiting[0]].target
            if self.running and not fits(add(held, need(nxt)), self.reservation):
                return
            self._launch(self.waiting.popleft())

    def idle(self, name: str) -> bool:
        slot = self.slots[name]
        return slot.current is None and not slot.queue

    def release(self, name: str) -> None:
        self.slots[name].stop()
        self.running.discard(name)
        self._start_candidates()

    @property
    def done(self) -> bool:
        return not self.running and not self.waiting


def runs_alone(work: Work, slot: Slot) -> bool:
    return work.what == "perf" and slot.target.device == "cpu"
