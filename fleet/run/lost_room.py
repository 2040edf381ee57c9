"""Targets that no live node can hold any more.

When a node is lost, each actor on it is replaced, and the new actor waits until Ray can place it.
If no other node has the cards of the lost node, Ray keeps that actor pending: a node could join.
The run waits for one for 60 s, or half of `run.start_timeout_s` if that is shorter. Then it fails
the target, so that a run over a fleet that lost a node ends (partial, and `--resume` finishes it)
instead of waiting out `run.start_timeout_s` for room that no longer exists. Only the totals of the
live nodes count: a target that merely waits for other targets' cards to be freed is not affected.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fleet.run.placement import footprint, places

if TYPE_CHECKING:
    from fleet.contracts.targets import TargetArgs

CHECK_EVERY_S = 1.0  # how often the driver asks Ray for the live nodes while an actor is starting (one cheap call)
GRACE_S = 60.0  # at most this long a target that no live node can hold waits for one to join


class LostRoom:
    """Which starting actors' targets no live node can hold, and since when."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.since: dict[str, float] = {}  # target key -> when no live node could first hold it
        self.checked = -CHECK_EVERY_S

    def homeless(self, starting: dict[str, TargetArgs], say: Callable[[str], None]) -> list[str]:
        """Of the targets whose actors are starting (by key), those that have waited the grace
        period with no live node that can hold them; `say` tells of each when it is first found."""
        now = time.monotonic()
        if not starting:
            self.since.clear()
        if not starting or now - self.checked < CHECK_EVERY_S:
            return []
        self.checked = now
        nodes = _live_nodes()
        lost = {key for key, target in starting.items() if not places(target, nodes)}
        for key in sorted(lost - set(self.since)):
            say(f"{key}: no live node can hold it; waiting {self.grace:g} s for one to join")
        self.since = {key: self.since.get(key, now) for key in lost}
        return sorted(key for key in lost if now - self.since[key] >= self.grace)


def unplaceable(target: TargetArgs) -> str | None:
    """Why no live node can hold `target` any more; None if some can."""
    if places(target, _live_nodes()):
        return None
    if target.spans_nodes:
        need = f"{target.pipeline_parallel_size} nodes of {target.tensor_parallel_size} cards"
    else:
        need = f"{footprint(target)} on one node"
    return f"no live node can hold it any more (it needs {need}; was a node lost?)"


def _live_nodes() -> list[dict[str, float]]:
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]
