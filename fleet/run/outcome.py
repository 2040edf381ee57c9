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


class Verdicts:
    """Why a target did not pass in this run, for `after:`: it failed, some of its work did, or its
    gates failed. Its gates are asked once, when all its rows are scored (AdmittedModel._unsettled)."""

    def __init__(self, outcome: Outcome, gates_of: GateCheck | None, *, rows_stored: Callable[[], None]) -> None:
        """`rows_stored`: returns once every row written so far is on disk (its gates read them)."""
        self.outcome, self.gates_of, self.rows_stored = outcome, gates_of, rows_stored
        self.gate_verdicts: dict[tuple[str, str], str | None] = {}

    def not_passed(self, model: str, target: str) -> str | None:
        """Why `target` of `model` did not pass (None: it did, so far)."""
        key = f"{model}/{target}"
        if key in self.outcome.failures:
            return self.outcome.failures[key]
        failed = sorted(s for s in self.outcome.failed_shards if s.startswith(f"{key}/"))
        if failed:
            return f"failed: {', '.join(failed)}"
        if self.gates_of is None:
            return None
        if (model, target) not in self.gate_verdicts:
            self.rows_stored()
            self.gate_verdicts[model, target] = self.gates_of(model, target)
        return self.gate_verdicts[model, target]
