"""A run directory: Parquet tables partitioned by model and target, plus run.json.

Layout (results/README.md):  <run_dir>/<table>/<model>/<weights>/<target>/<prompt_set>-<chunk>.parquet
Every file is written to a hidden temp name and renamed into place, so a crash never leaves a
half-written file under a name that readers pick up; run.json says whether the run finished.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from fleet import schema

if TYPE_CHECKING:
    import pyarrow as pa

RUN_JSON = "run.json"


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class RunStore:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    @classmethod
    def create(cls, run_dir: Path, info: dict[str, Any]) -> RunStore:
        """A new, empty run directory; refuses to reuse one that exists."""
        if run_dir.exists():
            msg = f"{run_dir}: run directory already exists; choose another --run-id"
            raise FileExistsError(msg)
        run_dir.mkdir(parents=True)
        store = cls(run_dir)
        store.write_info(info | {"status": "running", "started_at": now(), "schema_version": schema.SCHEMA_VERSION})
        return store

    def shard_path(self, table: str, shard_id: str, weights: str) -> Path:
        model, target, prompt_set, chunk = shard_id.split("/")
        return self.run_dir / table / model / weights / target / f"{prompt_set}-{chunk}.parquet"

    def write(self, table: str, shard_id: str, data: pa.Table) -> Path:
        """Write one shard's rows of `table`, conformed to its declared schema, under the
        weights it ran on: a model name reused for other weights lands in another directory."""
        data = schema.conform(data, schema.TABLES[table])
        weights = data.column("model_weights")[0].as_py() if data.num_rows else "none"
        path = self.shard_path(table, shard_id, weights)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(data, tmp, compression="zstd")
        tmp.replace(path)
        return path

    def info(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads((self.run_dir / RUN_JSON).read_text())
        return result

    def write_info(self, info: dict[str, Any]) -> None:
        _atomic_write_bytes(self.run_dir / RUN_JSON, json.dumps(info, indent=2, default=str).encode())

    def update_info(self, **changes: Any) -> None:
        self.write_info(self.info() | changes)
