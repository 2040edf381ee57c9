"""One run from start to end: validate the manifest, connect to Ray, dispatch, record provenance.

Nothing is written until the manifest has validated and the cluster has been found big enough,
so bad input never leaves a run directory behind.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import os
import platform
import socket
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleet.contracts.errors import UserError
from fleet.contracts.gates import LATEST_PASS
from fleet.contracts.inputs import check_name, check_url, clip, cut, inside, read_text
from fleet.contracts.schema import SCHEMA_VERSION
from fleet.contracts.targets import SOURCE_PREFLIGHT, engine_side
from fleet.results import reader
from fleet.results.catalog import require_runs
from fleet.results.direct import DirectSink, actors_write
from fleet.results.info import RunInfo
from fleet.results.store import RUN_JSON, RunStore, join, now
from fleet.run import manifest as manifest_mod
from fleet.run import manifest_file
from fleet.run.drill import DrillPoints, drill_plans
from fleet.run.outcome import GateCheck, Outcome
from fleet.run.placement import check_fits
from fleet.run.plan import ModelPlan, plan
from fleet.run.progress import Progress
from fleet.run.scheduler import execute

# (run_dir, model, target) -> why the target's gates failed on the rows written so far (None: passed).
RunGateCheck = Callable[[str | Path, str, str], str | None]


def default_run_id(manifest_path: Path) -> str:
    return f"{manifest_path.stem}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}"


def _connect(address: str | None, *, verbose: bool, num_cpus: int | None = None) -> bool:
    """Join the cluster at `address` (or $RAY_ADDRESS; "auto" finds one on this machine); without one
    start a private local Ray, never someone else's cluster by accident, with `num_cpus` CPU slots
    (default: the machine's cores). True if started here."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # else Ray 2.60 writes ~/.ray/auth_token
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    if num_cpus is not None and (address is not None or ray.is_initialized()):
        where = address or "this process's Ray"
        msg = f"--num-cpus sizes the private Ray that fleet run starts; the cluster at {where!r} has its own size"
        raise UserError(msg)
    if ray.is_initialized():
        return False
    sized = {} if num_cpus is None else {"num_cpus": num_cpus}
    ray.init(
        address=address or "local", include_dashboard=False, log_to_driver=verbose, configure_logging=verbose, **sized
    )
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
    num_cpus: int | None = None,
    progress: bool = True,
    verbose: bool = False,
    overrides: Sequence[str] = (),
    gates_of: RunGateCheck | None = None,
    drilldown_of: DrillPoints | None = None,
) -> tuple[str | Path, Outcome]:
    """Run a manifest and return the run directory and what failed (if anything).

    results_dir is a local directory or a URI (s3://bucket/prefix, see fleet.store.locate); the run
    directory is <results_dir>/<run_id>, returned in the same form (a Path stays a Path).
    `overrides` (`KEY=VALUE`, fleet.run.manifest_file.override) apply on top of the file; run.json keeps both.
    `gates_of(run_dir, model, target)`: why a target's gates failed on the rows so far (None: passed);
    `after:` waits for it (without it, `after:` checks failures only). `drilldown_of(run_dir, model)`:
    the model's real divergences, which a manifest's `drilldown:` probes once the parity rows are in."""
    manifest, run_dir, info, unresolved = check(
        manifest_path, results_dir=results_dir, run_id=run_id, overrides=overrides
    )
    with _ray(ray_address, verbose=verbose, num_cpus=num_cpus) as cluster:
        _check_cluster(manifest, cluster, manifest_path)
        with _storage(run_dir):  # e.g. no such bucket: nothing was written
            store = RunStore.create(run_dir, info)
        outcome = _execute(
            manifest,
            [p for p in plan(manifest) if p.model not in unresolved],
            store,
            cluster,
            progress=progress,
            failed_before_start={f"{m}/{t.name}": why for m, why in unresolved.items() for t in manifest.targets},
            gates_of=_bind(gates_of, run_dir),
        )
        outcome = _drill(manifest, store, cluster, outcome, drilldown_of=drilldown_of, progress=progress)
    return run_dir, outcome


def check(
    manifest_path: Path,
    *,
    results_dir: str | Path = Path("results"),
    run_id: str | None = None,
    overrides: Sequence[str] = (),
) -> tuple[manifest_mod.Manifest, str | Path, dict[str, Any], dict[str, str]]:
    """Everything `run` does before Ray starts (`fleet run --check`): the manifest, the run
    directory it would write (a name inside results_dir, not taken), every model's source. Returns
    the manifest, run directory, run.json's first contents and the models that cannot be resolved;
    writes nothing."""
    manifest = manifest_file.load(manifest_path, overrides=overrides)
    if "://" in str(results_dir):
        check_url(str(results_dir), what="--results")
    run_id = check_name(default_run_id(manifest_path) if run_id is None else run_id, what="--run-id")
    run_dir = join(results_dir, run_id)
    inside(results_dir, run_dir, what="--run-id")
    with _storage(run_dir):
        taken = RunStore(run_dir).exists()
    if taken:
        msg = f"{run_dir}: run directory already exists; choose another --run-id"
        raise UserError(msg)
    named = [run for g in manifest.gates for run in g.baseline_runs if run != LATEST_PASS]
    with _storage(results_dir):
        require_runs(results_dir, named, what="gates: baseline run")
    unresolved = _preflight(manifest)
    if unresolved and len(unresolved) == len(manifest.models):  # nothing could run: nothing is started
        msg = f"{manifest_path}: no model's source can be resolved, so nothing would run; "
        raise UserError(msg + next(iter(unresolved.values())))
    text = read_text(manifest_path, what="manifest")
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
    return manifest, run_dir, info, unresolved


def _preflight(manifest: manifest_mod.Manifest) -> dict[str, str]:
    """Models whose source cannot be resolved (e.g. an hf model missing from the offline cache),
    found before any actor starts: they are recorded as failing and the rest of the run goes on."""
    unresolved = {}
    preflight = engine_side(SOURCE_PREFLIGHT)
    for model in manifest.models:
        try:
            preflight(model.source)
        except UserError as e:
            unresolved[model.name] = cut(f"model {model.name!r}: {e}", 300)
    if unresolved and len(unresolved) < len(manifest.models):
        for why in unresolved.values():
            print(f"error: {why}; its targets are skipped", file=sys.stderr)
    return unresolved


def resume(
    run_dir: str | Path,
    *,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    progress: bool = True,
    verbose: bool = False,
    gates_of: RunGateCheck | None = None,
    drilldown_of: DrillPoints | None = None,
) -> tuple[str | Path, Outcome]:
    """Finish an interrupted run: only the shards without a written `shards` row run again (and the
    drill-down, when the manifest asks for one, from the start: it is one step after the rest)."""
    store, info, manifest, plans = check_resume(run_dir)
    with _ray(ray_address, verbose=verbose, num_cpus=num_cpus) as cluster:
        _check_cluster(manifest, cluster, join(run_dir, RUN_JSON))
        store.update_info(status="running", resumed_at=[*info.resumed_at, now()])
        outcome = _execute(
            manifest,
            plans,
            store,
            cluster,
            progress=progress,
            before=info,
            gates_of=_bind(gates_of, run_dir),
        )
        outcome = _drill(manifest, store, cluster, outcome, drilldown_of=drilldown_of, progress=progress)
    return run_dir, outcome


def check_resume(
    run_dir: str | Path,
) -> tuple[RunStore, RunInfo, manifest_mod.Manifest, list[ModelPlan]]:
    """Everything `resume` does before Ray starts (`fleet run --check --resume`): run.json, the
    manifest recorded in it, and the work still to do, read from the stored tables."""
    with _storage(run_dir):
        info = reader.read_info(run_dir)
        store = RunStore(run_dir)
    where = join(run_dir, RUN_JSON)
    if info.schema_version != SCHEMA_VERSION:
        msg = f"{cut(str(run_dir), 200)}: written with schema version {clip(info.schema_version, 40)}; "
        msg += f"this fleet-eval writes {SCHEMA_VERSION} and cannot add to it (report, compare and query still read it)"
        raise UserError(msg)
    try:
        manifest = manifest_mod.Manifest.model_validate(info.manifest_resolved)
    except ValidationError as e:
        raise UserError(manifest_file.format_error(where, info.manifest_resolved, e)) from None
    with _storage(run_dir), reader.decoding(run_dir):
        done = store.completed_shards(), store.completed_perf(), store.completed_probes()
    return store, info, manifest, [p.remaining(*done) for p in plan(manifest)]


@contextlib.contextmanager
def _storage(run_dir: str | Path) -> Iterator[None]:
    """Results storage that does not answer (endpoint, credentials, no such bucket) is bad input."""
    try:
        yield
    except OSError as e:
        raise UserError(f"{run_dir}: {e}") from None


@contextlib.contextmanager
def _ray(address: str | None, *, verbose: bool, num_cpus: int | None = None) -> Iterator[dict[str, float]]:
    started_here = _connect(address, verbose=verbose, num_cpus=num_cpus)
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
    plans: list[ModelPlan],
    store: RunStore,
    cluster: dict[str, float],
    *,
    progress: bool,
    before: RunInfo | None = None,
    failed_before_start: dict[str, str] | None = None,
    gates_of: GateCheck | None = None,
) -> Outcome:
    """Dispatch shards and perf levels, then record in run.json how it ended (also when interrupted)."""
    status, outcome = "interrupted", Outcome()
    sink = _sink(manifest, store)
    try:
        planned = +Counter({p.model: len(p.shards) + len(p.perf) for p in plans})  # +: no model without work
        with Progress(planned, enabled=progress) as bar:
            outcome = execute(manifest, plans, store, bar, cluster=cluster, gates_of=gates_of, sink=sink)
        outcome.failures = (failed_before_start or {}) | outcome.failures
        status = "partial" if outcome.partial else "complete"
    finally:
        store.update_info(
            status=status,
            finished_at=now(),
            provenance=(before.provenance if before else {}) | outcome.provenance,
            failures=outcome.failures,
            failed_shards=outcome.failed_shards,
            retries=(before.retries if before else 0) + outcome.retries,
            models=(before.timeline if before else {}) | outcome.timeline,
            cluster=_cluster(),
            write="driver" if sink is None else "actors",  # who wrote the rows (run.write; the last session's)
        )
    return outcome


def _drill(
    manifest: manifest_mod.Manifest,
    store: RunStore,
    cluster: dict[str, float],
    outcome: Outcome,
    *,
    drilldown_of: DrillPoints | None,
    progress: bool,
) -> Outcome:
    """The drill-down, after every model's parity rows are stored: layer probes at each real
    divergence (fleet/run/drill.py); what fails is added to run.json's failed_shards."""
    if manifest.drilldown is None:
        return outcome
    if drilldown_of is None:
        msg = "the manifest asks for a drill-down: pass drilldown_of (fleet.analysis.drilldown.points)"
        raise ValueError(msg)
    failed = {key.split("/", 1)[0] for key in outcome.failures}
    points = {m.name: drilldown_of(store.run_dir, m.name) for m in manifest.models if m.name not in failed}
    plans = drill_plans(manifest, points)
    if not plans:
        return outcome
    with Progress(Counter(), enabled=progress) as bar:
        found = ", ".join(f"{model} {len(p)}" for model, p in points.items() if p)
        bar.write(f"drill-down: layer probes at the real divergences ({found})")
        more = execute(manifest, plans, store, bar, cluster=cluster)
    # A target whose drill-down actor failed is recorded as that work failing, not the target: its
    # parity rows stand, and its gates read those.
    lost = more.failed_shards | {f"{key}/drilldown": why for key, why in more.failures.items()}
    merged = Outcome(
        provenance=outcome.provenance,
        failures=outcome.failures,
        failed_shards=outcome.failed_shards | lost,
        retries=outcome.retries + more.retries,
        timeline=outcome.timeline,
    )
    recorded = store.info()  # on a resume, its retries count those of the runs before
    store.update_info(
        failed_shards=recorded.get("failed_shards", {}) | lost,
        retries=int(recorded.get("retries", 0)) + more.retries,
    )
    return merged


def _sink(manifest: manifest_mod.Manifest, store: RunStore) -> DirectSink | None:
    """Where the actors store their own rows (`run.write`, fleet/results/direct.py); None: the driver writes."""
    import ray

    nodes = len([n for n in ray.nodes() if n.get("Alive")])
    if not actors_write(manifest.run.write, store, nodes=nodes):
        return None
    # A local directory as an absolute path: an actor's working directory is not the driver's.
    return DirectSink(store.root if store.local else str(store.run_dir), store.run_id, manifest.reference)


def _bind(gates_of: RunGateCheck | None, run_dir: str | Path) -> GateCheck | None:
    return None if gates_of is None else functools.partial(gates_of, run_dir)


def _cluster() -> dict[str, Any]:
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {"nodes": [n.get("NodeManagerHostname") for n in nodes], "resources": ray.cluster_resources()}
