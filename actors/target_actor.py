"""The Ray actor that owns a target's card(s): it resolves the model on its own node, builds the
engine inside its own process, and serves calls until the driver shuts it down.

It holds no Ray import at module level: the driver wraps it with
`ray.remote(TargetActor).options(...)`, naming it by "module:Class" string, so the same class
runs in tests without a cluster. Capability calls check the engine against the Protocol of the
capability the backend declares (fleet/contracts/engine.py) instead of probing for methods.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from actors import engine_class
from fleet.contracts.engine import ProbesLayers, ProbesLogits, ResolvedModel, RunsPerf, Smokes

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow as pa

    from fleet.contracts.engine import Generation, PerfResult, Positions, Prefix, RowSink
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.scenario import Scenario
    from fleet.contracts.spec import ModelSpec, Sampling, Shard
    from fleet.contracts.targets import Capability, TargetArgs


class TargetActor:
    def __init__(self, target: TargetArgs, model: ModelSpec, sampling: Sampling) -> None:
        self._build(target, model, sampling)

    def _build(self, target: TargetArgs, model: ModelSpec, sampling: Sampling) -> None:
        """Resolve the model and build the target's engine in this process; again, for the next
        target of this actor's shape, once `shutdown` ended the last engine (fleet/run/idle_actors.py)."""
        from actors import threads
        from actors.devices import pin_visible_devices
        from actors.reaper import guard_children
        from actors.sources import resolver, weights_digest

        if not target.spans_nodes:  # over several nodes the actor holds no card; vLLM's workers do
            pin_visible_devices(target.device)  # before any engine import touches the device
        self.threads = threads.apply(target)  # before the engine starts its thread pools
        self.target = target
        source = resolver(model.source)
        path = source.local_dir()
        noise = getattr(target, "weight_noise", None)
        if noise is not None:  # a calibrate mutant: a noisy copy, whose own digest provenance records
            from actors.weight_noise import noisy_copy

            path = noisy_copy(path, weights_digest(path), noise)
        self.model = ResolvedModel(model, path, weights_digest(path), source.resolved_revision())
        self.engine = engine_class(target.kind)(target, self.model, sampling=sampling)
        guard_children()  # the engine's processes (a card's engine core, TP ranks) die with this actor

    def generate(self, shard: Shard) -> Generation:
        return self.engine.generate(shard.loaded())  # a file's rows are read here, not in the driver

    def score(self, requests: pa.Table, *, k: int, twin: str | None = None) -> pa.Table:
        return self.engine.score(requests, k=k, twin=twin)

    def generate_to(self, shard: Shard, sink: RowSink) -> Any:
        """`generate`, its rows stored here by `sink` (the engines write their own rows): the
        driver gets back only where they wait."""
        return sink.generated(self.generate(shard))

    def score_stored(self, sink: RowSink, stored: Any, *, k: int, twin: str | None = None) -> Any:
        """`score` of a candidate shard as `sink` stored it (`stored` says how it finds it), read,
        scored and stored again here."""
        return sink.scored(stored, functools.partial(self.engine.score, k=k, twin=twin))

    def describe(self, *, build: tuple[TargetArgs, ModelSpec, Sampling] | None = None) -> dict[str, str]:
        """Provenance: the engine's environment plus exactly which weights it loaded, and where.
        `build`: a kept actor builds this (target, model, sampling)'s engine first."""
        if build is not None:
            self._build(*build)
        import json
        import os

        import ray

        from actors import threads

        m = self.model
        info = self.engine.describe()
        ranks = json.loads(info.pop("rank_threads")) if "rank_threads" in info else None
        return info | {
            "threads": json.dumps(threads.describe(self.threads, ranks)),
            "placement_group": json.dumps(_placement_group()),
            "node_id": ray.get_runtime_context().get_node_id(),
            "accelerator_ids": json.dumps(ray.get_runtime_context().get_accelerator_ids()),
            "pid": str(os.getpid()),
            "model_dir": str(m.path),
            "weights_sha256": m.weights,
            "source": m.spec.source.model_dump_json(),
            "revision": m.revision or "",
        }

    def perf(
        self, scenario: Scenario, level: int, prompts: list[Prompt] | None, parity_prompts: list[Prompt] | None = None
    ) -> PerfResult:
        return self._capable("perf", RunsPerf).perf(scenario, level, prompts, parity_prompts)

    def probe_logits(self, prompts: list[Prompt], *, prompt_set: str, positions: Positions) -> pa.Table:
        return self._capable("probe_logits", ProbesLogits).probe_logits(
            prompts, prompt_set=prompt_set, positions=positions
        )

    def probe_layers(
        self,
        prompts: Sequence[Prompt | Prefix],
        *,
        prompt_set: str,
        positions: Positions,
        sublayers: bool = False,
        twin: str | None = None,
    ) -> pa.Table:
        return self._capable("probe_layers", ProbesLayers).probe_layers(
            prompts, prompt_set=prompt_set, positions=positions, sublayers=sublayers, twin=twin
        )

    def smoke(self) -> pa.Table:
        return self._capable("smoke", Smokes).smoke()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def _capable(self, capability: Capability, protocol: Any) -> Any:
        """The engine as `protocol`, when its backend declares `capability` (the registry test
        checks that every declared capability is implemented)."""
        if not self.target.can(capability) or not isinstance(self.engine, protocol):
            msg = f"{self.target.kind!r} targets do not declare the {capability!r} capability"
            raise TypeError(msg)
        return self.engine


def _placement_group() -> dict[str, object] | None:
    """The placement group this actor runs in, with the node of each bundle (None outside one)."""
    import ray
    from ray.util import placement_group_table

    pg = ray.util.get_current_placement_group()
    if pg is None:
        return None
    table = placement_group_table(pg)
    nodes = table["bundles_to_node_id"]
    return {
        "id": pg.id.hex(),
        "strategy": table["strategy"],
        "bundles": [table["bundles"][i] for i in sorted(table["bundles"])],
        "bundle_nodes": [nodes.get(i) for i in sorted(table["bundles"])],
    }
