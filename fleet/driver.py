"""One run from start to end: validate the manifest, connect to Ray, dispatch, record provenance.

Nothing is written until the manifest has validated and the cluster has been found big enough,
so bad input never leaves a run directory behind.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

from fleet import manifest as manifest_mod
from fleet.errors import UserError
from fleet.plan import plan
from fleet.scheduler import Outcome, check_fits, execute
from fleet.store import RunStore, now


def default_run_id(manifest_path: Path) -> str:
    return f"{manifest_path.stem}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}"


def _connect(address: str | None, *, verbose: bool) -> bool:
    """Join the cluster at `address` (or $RAY_ADDRESS); without one start a local Ray. True if started here."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # else Ray 2.60 writes ~/.ray/auth_token
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    ray.init(address=address, include_dashboard=False, log_to_driver=verbose, configure_logging=verbose)
    return address is None


def _driver_versions() -> dict[str, str]:
    import importlib.metadata as md

    versions = {"python": platform.python_version(), "hostname": socket.gethostname()}
    for dist in ("fleet-eval", "ray", "pyarrow", "polars", "pydantic"):
        with contextlib.suppress(md.PackageNotFoundError):
            versions[dist] = md.version(dist)
    return versions


def run(
    manifest_path: Path,
    *,
    results_dir: Path = Path("results"),
    run_id: str | None = None,
    ray_address: str | None = None,
    progress: bool = True,
    verbose: bool = False,
) -> tuple[Path, Outcome]:
    """Run a manifest and return the run directory and what failed (if anything)."""
    from tqdm import tqdm

    manifest = manifest_mod.load(manifest_path)
    run_dir = results_dir / (run_id or default_run_id(manifest_path))
    if run_dir.exists():
        msg = f"{run_dir}: run directory already exists; choose another --run-id"
        raise UserError(msg)
    started_here = _connect(ray_address, verbose=verbose)
    import ray

    try:
        try:
            check_fits(manifest, ray.cluster_resources())
        except RuntimeError as e:
            raise UserError(f"{manifest_path}: {e}") from None
        text = manifest_path.read_text(encoding="utf-8")
        store = RunStore.create(
            run_dir,
            {
                "run_id": run_dir.name,
                "manifest_path": str(manifest_path),
                "manifest_sha256": hashlib.sha256(text.encode()).hexdigest(),
                "manifest": text,
                "manifest_resolved": manifest.model_dump(mode="json"),
                "reference": manifest.reference,
                "command": sys.argv,
                "driver": _driver_versions(),
            },
        )
        shards = plan(manifest)
        status = "interrupted"
        outcome = Outcome()
        try:
            with tqdm(total=len(shards), unit="shard", desc="shards", disable=not progress, file=sys.stderr) as bar:
                outcome = execute(manifest, shards, store, bar)
            status = "partial" if outcome.failures else "complete"
        finally:
            store.update_info(
                status=status,
                finished_at=now(),
                provenance=outcome.provenance,
                failures=outcome.failures,
                cluster=_cluster(),
            )
    finally:
        if started_here:
            ray.shutdown()
    return run_dir, outcome


def _cluster() -> dict[str, Any]:
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {"nodes": [n.get("NodeManagerHostname") for n in nodes], "resources": ray.cluster_resources()}
