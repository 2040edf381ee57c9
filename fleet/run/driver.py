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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fleet.contracts.errors import UserError
from fleet.contracts.spec import Shard
from fleet.contracts.targets import SOURCE_PREFLIGHT, engine_side
from fleet.results.store import RUN_JSON, RunStore, join, now
from fleet.run import manifest as manifest_mod
from fleet.run.placement import check_fits
from fleet.run.plan import PerfRun, ProbeRun, plan, plan_perf, plan_probes
from fleet.run.scheduler import Outcome, execute


def default_run_id(manifest_path: Path) -> str:
    return f"{manifest_path.stem}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}"


def _connect(address: str | None, *, verbose: bool) -> bool:
    """Join the cluster at `address` (or $RAY_ADDRESS; "auto" finds one on this machine); without one
    start a private local Ray, never someone else's cluster by accident. True if started here."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # else Ray 2.60 writes ~/.ray/auth_token
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    ray.init(address=address or "local", include_dashboard=False, log_to_driver=verbose, configure_logging=verbose)
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
    results_dir: str | Path = Path("results"),
    run_id: str | None = None,
    ray_address: str | None = None,
    progress: bool = True,
    verbose: bool = False,
    overrides: Sequence[str] = (),
) -> tuple[str | Path, Outcome]:
    """Run a manifest and return the run directory and what failed (if anything).

    results_dir is a local directory or a URI (s3://bucket/prefix, see fleet.store.locate); the run
    directory is <results_dir>/<run_id>, returned in the same form (a Path stays a Path).
    `overrides` (`KEY=VALUE`, fleet.run.manifest.override) apply on top of the file; run.json keeps both."""
    manifest = manifest_mod.load(manifest_path, overrides=overrides)
    unresolved = _preflight(manifest)
    run_id = run_id or default_run_id(manifest_path)
    run_dir = join(results_dir, run_id)
    with _storage(run_dir):
        taken = RunStore(run_dir).exists()
    if taken:
        msg = f"{run_dir}: run directory already exists; choose another --run-id"
        raise UserError(msg)
    text = manifest_path.read_text(encoding="utf-8")
    info = {
        "run_id": run_id,
        "manifest_path": str(manifest_path),
        "manifest_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "manifest": text,
        "overrides": list(overrides),
        "manifest_resolved": manifest.model_dump(mode="json"),
        "reference": manifest.reference,
        "command": sys.argv,
        "driver": _driver_versions(),
    }
    with _ray(ray_address, verbose=verbose) as cluster:
        _check_cluster(manifest, cluster, manifest_path)
        with _storage(run_dir):  # e.g. no such bucket: nothing was written
            store = RunStore.create(run_dir, info)
        outcome = _execute(
            manifest,
            [s for s in plan(manifest) if s.model not in unresolved],
            [p for p in plan_perf(manifest) if p.model not in unresolved],
            [p for p in plan_probes(manifest) if p.model not in unresolved],
            store,
            cluster,
            progress=progress,
            failed_before_start={f"{m}/{t.name}": why for m, why in unresolved.items() for t in manifest.targets},
        )
    return run_dir, outcome


def _preflight(manifest: manifest_mod.Manifest) -> dict[str, str]:
    """Models whose source cannot be resolved (e.g. an hf model missing from the offline cache),
    found before any actor starts: they are recorded as failing and the rest of the run goes on."""
    unresolved = {}
    preflight = engine_side(SOURCE_PREFLIGHT)
    for model in manifest.models:
        try:
            preflight(model.source)
        except UserError as e:
            unresolved[model.name] = f"model {model.name!r}: {e}"
            print(f"error: {unresolved[model.name]}; its targets are skipped", file=sys.stderr)
    return unresolved


def resume(
    run_dir: str | Path, *, ray_address: str | None = None, progress: bool = True, verbose: bool = False
) -> tuple[str | Path, Outcome]:
    """Finish an interrupted run: only the shards without a written `shards` row run again."""
    store = RunStore(run_dir)
    with _storage(run_dir):
        try:
            info = store.info()
        except FileNotFoundError:
            msg = f"{run_dir}: not a run directory (no {RUN_JSON})"
            raise UserError(msg) from None
    manifest = manifest_mod.Manifest.model_validate(info["manifest_resolved"])
    done, perf_done = store.completed_shards(), store.completed_perf()
    todo = [s for s in plan(manifest) if s.shard_id not in done]
    perf_todo = [p for p in plan_perf(manifest) if p.run_id not in perf_done]
    probes_done = {ProbeRun(*key) for key in store.completed_probes()}
    probes_todo = [p for p in plan_probes(manifest) if p not in probes_done]
    with _ray(ray_address, verbose=verbose) as cluster:
        _check_cluster(manifest, cluster, join(run_dir, RUN_JSON))
        store.update_info(status="running", resumed_at=[*info.get("resumed_at", []), now()])
        outcome = _execute(manifest, todo, perf_todo, probes_todo, store, cluster, progress=progress, before=info)
    return run_dir, outcome


@contextlib.contextmanager
def _storage(run_dir: str | Path) -> Iterator[None]:
    """Results storage that does not answer (endpoint, credentials, no such bucket) is bad input."""
    try:
        yield
    except OSError as e:
        raise UserError(f"{run_dir}: {e}") from None


@contextlib.contextmanager
def _ray(address: str | None, *, verbose: bool) -> Iterator[dict[str, float]]:
    started_here = _connect(address, verbose=verbose)
    import ray

    try:
        yield ray.cluster_resources()
    finally:
        if started_here:
            ray.shutdown()


def _check_cluster(manifest: manifest_mod.Manifest, cluster: dict[str, float], where: str | Path) -> None:
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    try:
        check_fits(manifest, cluster, nodes)
    except RuntimeError as e:
        raise UserError(f"{where}: {e}") from None


def _execute(
    manifest: manifest_mod.Manifest,
    shards: list[Shard],
    perf: list[PerfRun],
    probes: list[ProbeRun],
    store: RunStore,
    cluster: dict[str, float],
    *,
    progress: bool,
    before: dict[str, Any] | None = None,
    failed_before_start: dict[str, str] | None = None,
) -> Outcome:
    """Dispatch shards and perf levels, then record in run.json how it ended (also when interrupted)."""
    from tqdm import tqdm

    before = before or {}
    status, outcome = "interrupted", Outcome()
    try:
        total = len(shards) + len(perf)
        with tqdm(total=total, unit="shard", desc="shards+perf", disable=not progress, file=sys.stderr) as bar:
            outcome = execute(manifest, shards, perf, store, bar, cluster=cluster, probes=probes)
        outcome.failures = (failed_before_start or {}) | outcome.failures
        status = "partial" if outcome.partial else "complete"
    finally:
        store.update_info(
            status=status,
            finished_at=now(),
            provenance=before.get("provenance", {}) | outcome.provenance,
            failures=outcome.failures,
            failed_shards=outcome.failed_shards,
            retries=before.get("retries", 0) + outcome.retries,
            models=before.get("models", {}) | outcome.timeline,
            cluster=_cluster(),
        )
    return outcome


def _cluster() -> dict[str, Any]:
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {"nodes": [n.get("NodeManagerHostname") for n in nodes], "resources": ray.cluster_resources()}
