"""Actors kept between targets: a target's actor whose engine shut down cleanly waits here, and the
next target of the same shape builds its engine in that process instead of a new one.

Most of an engine's start is its process's start, not the engine: a new actor process imports
vLLM (11-12 s on a quiet 2-core host; torch_npu's init on a card) before it builds a tiny CPU
engine in 2-3 s (docs/measurements.md). A matrix's variants, calibrate's mutants and the models
of a manifest run one after another on the same shape of actor, so each reuses the last one's.

The same shape: the same Ray options (CPU slots, cards, resources) and the same process
environment (the runtime env Ray starts it with), on one card: a multi-card engine holds its
placement group, which is released with its actor. Only an actor whose engine answered and shut
down cleanly is kept; one that failed is killed, as before. A kept actor still holds its Ray
resources, so before a target of another shape starts, every kept actor is killed: the cluster
never holds more than the scheduler's reservations account for.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

Shape = str


def shape(options: dict[str, Any]) -> Shape:
    """What must match for an actor process to be reused: its Ray options, runtime env included."""
    return json.dumps(options, sort_keys=True, default=str)


class IdleActors:
    """The driver's idle actors, by shape; one run's, killed when it ends."""

    def __init__(self) -> None:
        self.kept: dict[Shape, list[Any]] = {}

    def keep(self, key: Shape, handle: Any) -> None:
        self.kept.setdefault(key, []).append(handle)

    def take(self, key: Shape) -> Any | None:
        """An idle actor of this shape, or None; with none, every idle actor is killed, so that the
        new one finds their resources free."""
        if self.kept.get(key):
            return self.kept[key].pop()
        self.clear()
        return None

    def clear(self) -> None:
        import ray

        for handle in (h for handles in self.kept.values() for h in handles):
            with contextlib.suppress(Exception):  # already gone: nothing to kill
                ray.kill(handle, no_restart=True)
        self.kept.clear()
