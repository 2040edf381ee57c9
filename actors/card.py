"""The Ray actor that owns one card: it resolves the model on its own node, builds the engine
inside its own process, and serves shards until the driver shuts it down.

It holds no Ray import: the scheduler wraps it with `ray.remote(Card).options(...)`, so the
same class runs in tests without a cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors import engine_class
from actors.base import ResolvedModel

if TYPE_CHECKING:
    import pyarrow as pa

    from actors.base import Generation, TargetArgs
    from actors.perf import PerfResult, Scenario
    from fleet.manifest import ModelSpec, Sampling
    from fleet.plan import Shard
    from fleet.prompts import Prompt


class Card:
    def __init__(self, target: TargetArgs, model: ModelSpec, sampling: Sampling) -> None:
        from actors.devices import pin_visible_devices
        from fleet.sources import weights_digest

        pin_visible_devices(target.device)  # before any engine import touches the device
        self.target = target
        path = model.source.local_dir()
        self.model = ResolvedModel(model, path, weights_digest(path), model.source.resolved_revision())
        self.engine = engine_class(target.kind)(target, self.model, sampling=sampling)

    def generate(self, shard: Shard) -> Generation:
        return self.engine.generate(shard)

    def score(self, requests: pa.Table, *, k: int) -> pa.Table:
        return self.engine.score(requests, k=k)

    def describe(self) -> dict[str, str]:
        """Provenance: the engine's environment plus exactly which weights it loaded, and where."""
        import json
        import os

        import ray

        m = self.model
        return self.engine.describe() | {
            "node_id": ray.get_runtime_context().get_node_id(),
            "accelerator_ids": json.dumps(ray.get_runtime_context().get_accelerator_ids()),
            "pid": str(os.getpid()),
            "model_dir": str(m.path),
            "weights_sha256": m.weights,
            "source": m.spec.source.model_dump_json(),
            "revision": m.revision or "",
        }

    def perf(self, scenario: Scenario, level: int, prompts: list[Prompt] | None) -> PerfResult:
        return self.engine.perf(scenario, level, prompts)  # type: ignore[attr-defined]

    def probe(self, kind: str, prompts: list[Prompt], *, prompt_set: str, positions: str) -> pa.Table:
        """The `kind` ("logits" | "layers") probe: engine.probe_logits / engine.probe_layers."""
        method = getattr(self.engine, f"probe_{kind}")
        table: pa.Table = method(prompts, prompt_set=prompt_set, positions=positions)
        return table

    def smoke(self) -> pa.Table:
        return self.engine.smoke()  # type: ignore[attr-defined]

    def shutdown(self) -> None:
        self.engine.shutdown()
