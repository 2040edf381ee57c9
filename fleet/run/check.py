"""What a run (or a resume) does before Ray starts, which `fleet run --check` runs alone: the
manifest, the run directory (a new name inside the results root), the baseline runs gates name,
every model's source, and run.json's first contents. Nothing is written here, so bad input never
leaves a run directory behind.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import platform
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleet.contracts.backends import SOURCE_PREFLIGHT, engine_side
from fleet.contracts.errors import UserError
from fleet.contracts.gates import LATEST_PASS
from fleet.contracts.inputs import check_name, check_url, clip, cut, inside, read_text
from fleet.contracts.schema import SCHEMA_VERSION
from fleet.results import driver_lock, reader
from fleet.results.catalog import require_runs
from fleet.results.info import RunInfo
from fleet.results.staging import Staging
from fleet.results.store import RUN_JSON, RunStore, join
from fleet.run import manifest_file
from fleet.run.manifest import Manifest
from fleet.run.plan import ModelPlan, plan


def default_run_id(manifest_path: Path) -> str:
    return f"{manifest_path.stem}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}"


def check(
    manifest_path: Path,
    *,
    results_dir: str | Path = Path("results"),
    run_id: str | None = None,
    overrides: Sequence[str] = (),
) -> tuple[Manifest, str | Path, dict[str, Any], dict[str, str]]:
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
    with storage_errors(run_dir):
        taken = RunStore(run_dir).exists()
    if taken:
        msg = f"{run_dir}: run directory already exists; choose another --run-id"
        raise UserError(msg)
    named = [run for g in manifest.gates for run in g.baseline_runs if run != LATEST_PASS]
    with storage_errors(results_dir):
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


def _preflight(manifest: Manifest) -> dict[str, str]:
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


def check_resume(
    run_dir: str | Path,
) -> tuple[RunStore, RunInfo, Manifest, list[ModelPlan], dict[str, str]]:
    """Everything `resume` does before Ray starts (`fleet run --check --resume`): run.json, the
    manifest recorded in it, the work still to do, read from the stored tables, and the candidate
    shards among it that are stored but unscored (shard id -> weights: staged again to be scored)."""
    with storage_errors(run_dir):
        info = reader.read_info(run_dir)
        store = RunStore(run_dir)
    driver_lock.refuse_if_held(run_dir)  # another driver writing it: nothing here would hold
    where = join(run_dir, RUN_JSON)
    if info.schema_version != SCHEMA_VERSION:
        msg = f"{cut(str(run_dir), 200)}: written with schema version {clip(info.schema_version, 40)}; "
        msg += f"this fleet-eval writes {SCHEMA_VERSION} and cannot add to it (report, compare and query still read it)"
        raise UserError(msg)
    try:
        manifest = Manifest.model_validate(info.manifest_resolved)
    except ValidationError as e:
        raise UserError(manifest_file.format_error(where, info.manifest_resolved, e)) from None
    with storage_errors(run_dir), reader.decoding(run_dir):
        done = store.completed_shards(), store.completed_perf(), store.completed_probes()
        # Candidate shards written unscored (no reference was left) run again, to be scored only.
        unscored = Staging(store).unscored(manifest.reference, done[0])
    shards_done = done[0] - set(unscored)
    return store, info, manifest, [p.remaining(shards_done, *done[1:]) for p in plan(manifest)], unscored


@contextlib.contextmanager
def storage_errors(run_dir: str | Path) -> Iterator[None]:
    """Results storage that does not answer (endpoint, credentials, no such bucket) is bad input."""
    try:
        yield
    except OSError as e:
        raise UserError(f"{run_dir}: {e}") from None


def _driver_versions() -> dict[str, str]:
    import importlib.metadata as md

    versions = {"python": platform.python_version(), "hostname": socket.gethostname()}
    for dist in ("fleet-eval", "ray", "pyarrow", "polars", "pydantic"):
        with contextlib.suppress(md.PackageNotFoundError):
            versions[dist] = md.version(dist)
    return versions
