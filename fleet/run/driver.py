"""One run from start to end: the checks before Ray starts (fleet/run/check.py), Ray
(fleet/run/cluster.py), the run directory, dispatch (fleet/run/scheduler.py), the drill-down
(fleet/run/drill.py), and how it all ended, in run.json. `fleet run` and `fleet run --resume`.

Nothing is written until the manifest has validated and the cluster has been found big enough,
so bad input never leaves a run directory behind.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from fleet.contracts.errors import StoreError
from fleet.results import driver_lock
from fleet.results.direct import DirectSink, actors_write
from fleet.results.info import RunInfo
from fleet.results.packed import PackSink
from fleet.results.staging import Staging
from fleet.results.store import RUN_JSON, RunStore, join, now
from fleet.run.check import check, check_resume, storage_errors
from fleet.run.cluster import check_cluster, cluster_info, ray_cluster
from fleet.run.drill import DrillPoints, drill_plans
from fleet.run.manifest import Manifest
from fleet.run.outcome import GateCheck, Outcome
from fleet.run.plan import ModelPlan, plan
from fleet.run.progress import Progress
from fleet.run.scheduler import Loop

# (run_dir, model, target) -> why the target's gates failed on the rows written so far (None: passed).
RunGateCheck = Callable[[str | Path, str, str], str | None]


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
    with ray_cluster(ray_address, verbose=verbose, num_cpus=num_cpus) as cluster:
        check_cluster(manifest, cluster, manifest_path)
        with storage_errors(run_dir):  # e.g. no such bucket: nothing was written
            store = RunStore.create(run_dir, info)
        with driver_lock.hold(store):
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
    drill-down, when the manifest asks for one, from the start: it is one step after the rest);
    candidate shards stored unscored, since no reference was left to score them, are scored.
    A run another live driver is writing is refused before anything is read or started
    (fleet/results/driver_lock.py)."""
    with storage_errors(run_dir):  # e.g. an endpoint that does not answer
        held = RunStore(run_dir)
    with driver_lock.hold(held):
        store, info, manifest, plans, unscored = check_resume(run_dir)
        with ray_cluster(ray_address, verbose=verbose, num_cpus=num_cpus) as cluster:
            check_cluster(manifest, cluster, join(run_dir, RUN_JSON))
            store.update_info(status="running", resumed_at=[*info.resumed_at, now()])
            staging = Staging(store)
            for shard_id, weights in unscored.items():  # scored from there, as a shard staged taking turns
                staging.restage(shard_id, weights)
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


def _execute(
    manifest: Manifest,
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
            outcome = Loop(manifest, plans, store, bar, cluster=cluster, gates_of=gates_of, sink=sink).run()
        outcome.failures = (failed_before_start or {}) | outcome.failures
        status = "partial" if outcome.partial else "complete"
    except BaseException as e:
        # Where the CLI says to resume, after a refused store write, Ctrl-C or SIGTERM.
        e.run_dir = str(store.root)  # type: ignore[attr-defined]
        with contextlib.suppress(StoreError):  # a full disk refuses run.json too: the first error is the one to show
            _record(store, status, outcome, before, cluster=cluster, sink=sink)
        raise
    _record(store, status, outcome, before, cluster=cluster, sink=sink)
    return outcome


def _record(
    store: RunStore, status: str, outcome: Outcome, before: RunInfo | None, *, cluster: dict[str, float], sink: object
) -> None:
    """run.json: how the run's session ended, and what it did."""
    store.update_info(
        status=status,
        finished_at=now(),
        provenance=(before.provenance if before else {}) | outcome.provenance,
        failures=outcome.failures,
        failed_shards=outcome.failed_shards,
        retries=(before.retries if before else 0) + outcome.retries,
        models=(before.timeline if before else {}) | outcome.timeline,
        cluster=cluster_info(),
        # Who wrote the rows (run.write; the last session's).
        write="actors" if isinstance(sink, DirectSink) else "driver",
    )


def _drill(
    manifest: Manifest,
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
        more = Loop(manifest, plans, store, bar, cluster=cluster).run()
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


def _sink(manifest: Manifest, store: RunStore) -> DirectSink | PackSink:
    """Where the actors store their own rows (`run.write`, fleet/results/direct.py), or else how
    they hand them to the driver to store: encoded (fleet/results/packed.py)."""
    import ray

    nodes = len([n for n in ray.nodes() if n.get("Alive")])
    if not actors_write(manifest.run.write, store, nodes=nodes):
        return PackSink(store.run_id, manifest.reference)
    # A local directory as an absolute path: an actor's working directory is not the driver's.
    return DirectSink(store.root if store.local else str(store.run_dir), store.run_id, manifest.reference)


def _bind(gates_of: RunGateCheck | None, run_dir: str | Path) -> GateCheck | None:
    return None if gates_of is None else functools.partial(gates_of, run_dir)
