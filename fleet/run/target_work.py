"""A target's calls besides its shards, one class each (`Work`, fleet/run/work.py): `Describe`,
the first call to every actor, answered once its engine is up; `Smoke`, a server's API routes
checked once per target; and `Probe`, a deep probe on the manifest's prompt set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from fleet.run.manifest import probe_capability
from fleet.run.work import Effects, Work, Write

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet.run.plan import ProbeCall
    from fleet.run.work import SlotView


def _where(slot: SlotView) -> str:
    """The model/target prefix of the slot's result keys."""
    return f"{slot.model.name}/{slot.target.name}"


@dataclass(frozen=True)
class Describe(Work):
    """The first call to every actor: it answers once the engine is up, with its provenance. A
    kept actor (fleet/run/idle_actors.py) builds the slot's engine first."""

    starts_actor: ClassVar[bool] = True

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        return slot.handle.describe.remote(build=slot.build), slot.manifest.run.start_timeout_s

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
