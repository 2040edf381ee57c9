"""run.json, read once into a typed object: what every reader of a run (analysis, reports,
compare, resume) may rely on, checked where it is read (fleet.results.reader.read_info).

The driver writes run.json as it goes (fleet.run.driver, fleet.results.store): at the start the
manifest as written and as resolved, the reference and the driver's versions; at the end the
status, each target's provenance, what failed and the models' timeline. `manifest_resolved` stays
the manifest's JSON form (fleet.run.manifest.Manifest.model_dump): readers are below the run
package and take the few fields they need through the properties here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.contracts.errors import UserError

# Field -> the JSON type it must have when present (None is allowed: "not recorded").
_TYPES: dict[str, type | tuple[type, ...]] = {
    "reference": str,
    "run_id": str,
    "status": str,
    "started_at": str,
    "finished_at": str,
    "manifest_path": str,
    "manifest_sha256": str,
    "schema_version": int,
    "manifest_resolved": dict,
    "provenance": dict,
    "failures": dict,
    "failed_shards": dict,
    "retries": int,
    "models": dict,
    "driver": dict,
    "resumed_at": list,
    "gates": str,
}


@dataclass(frozen=True)
class RunInfo:
    reference: str
    run_id: str  # the directory's name when run.json has none (schema 2)
    status: str | None = None  # running, complete, partial
    started_at: str | None = None
    finished_at: str | None = None
    manifest_path: str | None = None
    manifest_sha256: str | None = None
    schema_version: int | None = None
    manifest_resolved: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, dict[str, Any]] = field(default_factory=dict)  # "model/target" -> facts
    failures: dict[str, str] = field(default_factory=dict)  # "model/target" -> why it failed
    failed_shards: dict[str, str] = field(default_factory=dict)  # shard id -> why
    retries: int = 0
    timeline: dict[str, dict[str, str]] = field(default_factory=dict)  # model -> admitted_at, finished_at
    driver: dict[str, Any] = field(default_factory=dict)  # the driver's package versions
    resumed_at: list[str] = field(default_factory=list)
    gates: str | None = None  # the verdict `fleet run` recorded
    stored: dict[str, Any] = field(default_factory=dict, repr=False)  # run.json as read, every key

    @classmethod
    def parse(cls, stored: Any, *, where: str, run_dir: str | Path) -> RunInfo:
        """`stored` (run.json's JSON) checked: an object naming its reference, each known field of its type."""
        if not isinstance(stored, dict):
            raise UserError(f"{where}: expected a JSON object, got {type(stored).__name__}")
        if "reference" not in stored:
            raise UserError(f"{where}: no 'reference'; the run directory is damaged or not fleet-eval's")
        for key, kind in _TYPES.items():
            value = stored.get(key)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
                raise UserError(f"{where}: {key} is a {type(value).__name__}, expected a {expected}")
        known = {k: stored[k] for k in _TYPES if stored.get(k) is not None and k != "models"}
        known["run_id"] = stored.get("run_id") or Path(str(run_dir)).name
        return cls(**known, timeline=stored.get("models") or {}, stored=stored)

    @classmethod
    def of(cls, stored: Mapping[str, Any]) -> RunInfo:
        """From a dict already trusted (tests, a run being written): no checks beyond the types."""
        return cls.parse(dict(stored), where="run.json", run_dir=str(stored.get("run_id", "run")))

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    # The resolved manifest's parts that readers use.
    @property
    def targets(self) -> list[dict[str, Any]]:
        return list(self.manifest_resolved.get("targets") or [])

    @property
    def model_names(self) -> list[str]:
        return [m["name"] for m in self.manifest_resolved.get("models") or []]

    @property
    def perf(self) -> list[dict[str, Any]]:
        return list(self.manifest_resolved.get("perf") or [])

    @property
    def prompts(self) -> dict[str, Any]:
        return dict(self.manifest_resolved.get("prompts") or {})

    @property
    def sampling(self) -> dict[str, Any]:
        return dict(self.manifest_resolved.get("sampling") or {})

    @property
    def probes(self) -> dict[str, Any]:
        return dict(self.manifest_resolved.get("probes") or {})

    @property
    def variants(self) -> dict[str, dict[str, Any]]:
        return dict(self.manifest_resolved.get("variants") or {})

    @property
    def repeats(self) -> dict[str, Any]:
        return dict(self.manifest_resolved.get("repeats") or {})

    @property
    def layout(self) -> str | None:
        return (self.manifest_resolved.get("report") or {}).get("layout")

    def target(self, name: str) -> dict[str, Any] | None:
        return next((t for t in self.targets if t.get("name") == name), None)
