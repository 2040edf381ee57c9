"""What a run learnt besides its rows, and how the scheduler asks whether a target passed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# (model, target) -> why its gates did not pass on the rows written so far (None: they passed, or it
# has none). The driver cannot evaluate gates itself (fleet.analysis is beside it, not below):
# `fleet run` passes fleet.report's.
GateCheck = Callable[[str, str], str | None]


@dataclass
class Outcome:
    """What the run learnt besides rows: provenance, failed targets, failed shards, retries."""

    provenance: dict[str, dict[str, str]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # "model/target" -> reason
    failed_shards: dict[str, str] = field(default_factory=dict)  # shard id -> reason
    retries: int = 0
    timeline: dict[str, dict[str, str]] = field(default_factory=dict)  # model -> admitted_at, finished_at

    @property
    def partial(self) -> bool:
        return bool(self.failures or self.failed_shards)
