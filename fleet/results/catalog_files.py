"""A results root's catalog on disk: what `fleet runs` and `fleet query ROOT` read instead of every
run's run.json (fleet/results/catalog.py checks it against the run directories).

    ROOT/_catalog/entries/<run>.<stamp>.json   a run's listing row, written by the run's own writer
                                               (RunStore.write_info) after each write of its run.json
    ROOT/_catalog/runs.json                    every run's row in one file: a cache readers rewrite

One file per run, not one shared file: two runs finishing at once into one root each write only
their own entry, so neither can lose the other's. One shared file would need a read-modify-write
under a lock, and an object store has neither locks nor rename. Each entry appears whole
(fleet/results/atomic.py), and a run's writes are sequential (one driver per run id).

A new name per write (`stamp` rises) rather than overwriting `<run>.json`: a reader knows an entry
changed from its name alone, with no trust in timestamps (S3's have one-second resolution, and two
writes of one size within a second would look alike). The writer deletes its older names after.

runs.json because listing entries/ is one request per 1,000 runs, but reading 1,000 entries is
1,000 GETs on S3. It holds every row with the name of the entry it reflects, so a reader fetches
only entries newer than that and rewrites runs.json when it fetched any. Readers racing to rewrite
it are harmless: it is derived data, and a row it holds for an older entry is simply re-read.

`_` first: a run id cannot start with it (fleet/contracts/inputs.py check_name), and Spark, Hive and
Trino skip such directories, so the catalog never shows up as a run or as data.
"""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow.fs as pafs

from fleet.results.atomic import put

CATALOG = "_catalog"
ENTRIES = f"{CATALOG}/entries"
SNAPSHOT = f"{CATALOG}/runs.json"
FORMAT = 1

Row = dict[str, Any]
# A run's listing row, by type: what `fleet runs` shows and `fleet query ROOT`'s `runs` table holds.
SUMMARY: dict[str, type] = {
    "run_id": str,
    "status": str,
    "models": str,
    "targets": str,
    "reference": str,
    "gates": str,
    "started_at": str,
    "finished_at": str,
    "schema_version": int,
}


def summary(info: dict[str, Any], run: str) -> Row:
    """The listing row of a run from its run.json."""
    manifest = info.get("manifest_resolved")
    manifest = manifest if isinstance(manifest, dict) else {}
    version = info.get("schema_version")
    return {
        "run_id": str(info.get("run_id") or run),
        "status": _text(info.get("status")),
        "models": _names(manifest.get("models")),
        "targets": _names(manifest.get("targets")),
        "reference": _text(info.get("reference")),
        "gates": _text(info.get("gates", "not recorded")),
        "started_at": _text(info.get("started_at")),
        "finished_at": _text(info.get("finished_at")),
        "schema_version": version if isinstance(version, int) and not isinstance(version, bool) else None,
    }


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _names(items: Any) -> str:
    """`a, b` of a manifest's models or targets; a run.json written by hand may hold anything."""
    return ", ".join(str(i.get("name")) for i in items if isinstance(i, dict)) if isinstance(items, list) else ""


def stat(info: pafs.FileInfo) -> list[int] | None:
    """What identifies one version of a local run.json without reading it: [mtime_ns, size]."""
    return None if info.type != pafs.FileType.File or info.mtime_ns is None else [info.mtime_ns, info.size]


def record(fs: pafs.FileSystem, run_root: str, info: dict[str, Any], run_json: list[int] | None) -> None:
    """Write the entry of the run at `run_root` from the run.json just written (`run_json`: its
    stat, where a stat is cheap), then drop the run's older entries."""
    results_root, _, run = run_root.rpartition("/")
    if not results_root:
        return
    older = _listing(fs, results_root).get(run, [])
    # Rising even if this host's clock is behind the one that wrote the last entry (a resume elsewhere).
    stamp = max([time.time_ns(), *(s + 1 for _, s in older)])
    row = summary(info, run) | {"run_json": run_json}
    put(fs, f"{results_root}/{ENTRIES}/{run}.{stamp:020d}.json", json.dumps(row).encode())
    for name, _ in older:
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(f"{results_root}/{ENTRIES}/{name}")


def read(fs: pafs.FileSystem, root: str) -> tuple[dict[str, Row], dict[str, str], bool]:
    """The rows the catalog holds by run directory name, the newest entry of each run, and whether
    runs.json is behind (an entry newer than its row was read). Each row says which entry it
    reflects (`entry`, None when it was read from a run.json the catalog had no entry for)."""
    newest = {run: max(names, key=lambda n: n[1])[0] for run, names in _listing(fs, root).items()}
    cached = _load(fs, f"{root}/{SNAPSHOT}")
    rows = {run: row for run, row in cached.items() if row.get("entry") == newest.get(run)}
    stale = [run for run in newest if run not in rows]
    with ThreadPoolExecutor(16) as pool:  # one GET each on S3
        fetched = pool.map(lambda run: _entry(fs, f"{root}/{ENTRIES}/{newest[run]}"), stale)
        for run, row in zip(stale, fetched, strict=True):
            if row is not None:  # a damaged entry: the caller reads the run.json instead
                rows[run] = row | {"entry": newest[run]}
    return rows, newest, bool(stale) or len(rows) != len(cached)


def save(fs: pafs.FileSystem, root: str, rows: dict[str, Row]) -> None:
    """Rewrite runs.json. Best effort: a reader without write access still lists, only slower."""
    with contextlib.suppress(OSError):
        put(fs, f"{root}/{SNAPSHOT}", json.dumps({"format": FORMAT, "rows": rows}).encode())


def _listing(fs: pafs.FileSystem, root: str) -> dict[str, list[tuple[str, int]]]:
    """Run -> its entries' (file name, stamp), from one listing of entries/."""
    found = fs.get_file_info(pafs.FileSelector(f"{root}/{ENTRIES}", allow_not_found=True))
    out: dict[str, list[tuple[str, int]]] = {}
    for f in found:
        run, _, rest = f.base_name.rpartition(".")[0].rpartition(".")
        if f.type == pafs.FileType.File and f.base_name.endswith(".json") and rest.isdigit() and run:
            out.setdefault(run, []).append((f.base_name, int(rest)))
    return out


def _entry(fs: pafs.FileSystem, path: str) -> Row | None:
    try:
        with fs.open_input_stream(path) as f:
            row = json.loads(f.read())
    except (OSError, ValueError):  # gone (a newer one replaced it) or damaged
        return None
    return row if _valid(row) else None


def _load(fs: pafs.FileSystem, path: str) -> dict[str, Row]:
    """runs.json's rows; none when it is missing or damaged (the entries and run.json files stand)."""
    try:
        with fs.open_input_stream(path) as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    rows = data.get("rows") if isinstance(data, dict) and data.get("format") == FORMAT else None
    if not isinstance(rows, dict) or not all(_valid(row) for row in rows.values()):
        return {}
    return rows


def _valid(row: Any) -> bool:
    """A row whose fields have their types (or are null): a hand-edited file cannot break the listing."""
    if not isinstance(row, dict):
        return False
    typed = all(row.get(key) is None or isinstance(row.get(key), kind) for key, kind in SUMMARY.items())
    run_json = row.get("run_json")
    stat_ok = run_json is None or (isinstance(run_json, list) and all(isinstance(x, int) for x in run_json))
    return typed and stat_ok and not isinstance(row.get("schema_version"), bool)
