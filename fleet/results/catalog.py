"""A results root (the directory, or s3:// prefix, that holds run directories) as one data set:
the runs it holds (`fleet runs`) and every stored table of every run stacked on `run_id`
(`fleet query RESULTS_ROOT`).

Both answer from the root's catalog (fleet/results/catalog_files.py) and listings, not by opening
every run.json: on S3 that is one GET for the whole root instead of one per run; and the stacked
tables come from one listing of the root instead of one per run and table, with each run's footers
left unread (8.2 s -> 0.8 s for `fleet query` over 1,000 local runs: benchmarks/runs_scale.py).
The catalog is checked against the root, never trusted blindly:
- the run directories are listed (one request per 1,000 on S3) and matched with its entries: a run
  copied in by hand, or a catalog deleted or damaged, is read from its run.json, and the rows read
  are cached for the next reader;
- locally each run.json is also stat'ed (a system call, no read): one changed behind the catalog's
  back (edited by hand; or a writer killed between run.json and its entry) is read again. On an
  object store that stat would be one request per run, the cost the catalog exists to avoid, so
  there an entry stands for its run.json; deleting <root>/_catalog has every run.json read again.
The tables stay lazy scans of the runs' Parquet files, so a query reads only the columns and row
groups it needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pyarrow.fs as pafs

from fleet.contracts import schema, stored_tables
from fleet.contracts.errors import UserError
from fleet.results import catalog_files, driver_lock, reader, store
from fleet.results.catalog_files import SUMMARY, Row
from fleet.results.store import RUN_JSON

_TYPES = {str: pl.String, int: pl.Int64}
RUNS_SCHEMA = {name: _TYPES[kind] for name, kind in SUMMARY.items()} | {"run_dir": pl.String}


def is_run(where: str | Path) -> bool:
    fs, root = store.locate(where)
    return fs.get_file_info(f"{root}/{RUN_JSON}").type == pafs.FileType.File


def is_root(where: str | Path) -> bool:
    """Whether `where` is a directory holding runs. A damaged run.json there is an error, not a no."""
    fs, root = store.locate(where)
    try:
        directory = fs.get_file_info(root).type == pafs.FileType.Directory
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return False
    return directory and bool(_rows(where))


def run_dirs(results_root: str | Path) -> list[str | Path]:
    """Every run directory directly under `results_root` (one holding a run.json), by name."""
    return [store.join(results_root, name) for name in sorted(_rows(results_root))]


def runs(results_root: str | Path) -> pl.DataFrame:
    """One row per run: id, status, models, targets, gate verdict (as `fleet run` recorded it), times."""
    return _frame(results_root, _rows(results_root))


def _frame(results_root: str | Path, rows: dict[str, Row]) -> pl.DataFrame:
    listed = [
        {k: row.get(k) for k in SUMMARY} | {"run_dir": str(store.join(results_root, n))} for n, row in rows.items()
    ]
    for row in listed:  # a cached `running` whose driver has gone since (fleet/results/driver_lock.py)
        row["status"] = driver_lock.status(row["status"], str(row["run_dir"]))
    return pl.DataFrame(listed, schema=RUNS_SCHEMA).sort("started_at", "run_id", nulls_last=True)


def _rows(results_root: str | Path) -> dict[str, Row]:
    """The listing row of every run under `results_root` by directory name, from the catalog where
    it is current, else from the run's run.json (see the module docstring)."""
    fs, root = store.locate(results_root)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        msg = f"{results_root}: no such results directory"
        raise UserError(msg)
    listing = fs.get_file_info(pafs.FileSelector(root))
    # `_catalog`, and hidden or temp directories: never a run (run ids start with a letter or digit).
    names = sorted(d.base_name for d in listing if d.type == pafs.FileType.Directory and d.base_name[0] not in "_.")
    known, entries, changed = catalog_files.read(fs, root)
    local = isinstance(fs, pafs.LocalFileSystem)
    checked = names if local else [name for name in names if name not in known]
    stats = dict(zip(checked, fs.get_file_info([f"{root}/{name}/{RUN_JSON}" for name in checked]), strict=True))
    rows: dict[str, Row] = {}
    unread: list[str] = []
    for name in names:
        found = stats.get(name)
        if found is not None and found.type != pafs.FileType.File:
            continue  # no run.json: not a run (whatever an entry says)
        row = known.get(name)
        if row is None or (found is not None and row.get("run_json") != catalog_files.stat(found)):
            unread.append(name)
        else:
            rows[name] = row
    with ThreadPoolExecutor(16) as pool:  # one GET each on S3; damaged run.json files fail as before
        infos = pool.map(lambda name: reader.read_info(store.join(results_root, name)), unread)
        for name, info in zip(unread, infos, strict=True):
            run_json = catalog_files.stat(stats[name]) if local else None
            rows[name] = catalog_files.summary(info.stored, name) | {"run_json": run_json, "entry": entries.get(name)}
    if changed or unread or set(known) != set(rows):
        catalog_files.save(fs, root, rows)
    return rows


def stacked(results_root: str | Path) -> dict[str, pl.LazyFrame]:
    """Every stored table of every run under `results_root`, stacked (each row has its run_id),
    plus `runs`. Tables only some runs have are stacked from those; a table no run has is empty."""
    rows = _rows(results_root)
    fs, root = store.locate(results_root)
    # A run's schema version (from the catalog) stands for its files': `fleet run --resume` never
    # adds files of another version. So a current run's files are scanned unopened, found by one
    # listing; older runs are loaded one by one, their footers checked (schema 2 lacks run_id).
    current = {name for name, row in rows.items() if row.get("schema_version") == schema.SCHEMA_VERSION}
    files = _files(fs, root, current)
    frames: dict[str, list[pl.LazyFrame]] = {}
    for table, arrow_schema in stored_tables.all_tables().items():
        frames[table] = [reader.scan(fs, files[table], arrow_schema)] if files.get(table) else []
    for name in sorted(set(rows) - current):
        for table, frame in reader.load(store.join(results_root, name)).items():
            frames.setdefault(table, []).append(frame)
    out = {
        table: pl.concat(parts, how="diagonal_relaxed") if parts else reader.empty(stored_tables.all_tables()[table])
        for table, parts in frames.items()
    }
    return out | {"runs": _frame(results_root, rows).lazy()}


def _files(fs: pafs.FileSystem, root: str, runs: set[str]) -> dict[str, list[str]]:
    """Table name -> the Parquet files of that table in `runs`, in path order, from one listing of
    the root (on S3 one request per 1,000 files, not one per run and table)."""
    tables = stored_tables.all_tables()
    out: dict[str, list[str]] = {}
    if not runs:
        return out
    for f in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        parts = f.path[len(root) + 1 :].split("/")
        wanted = len(parts) > 2 and parts[0] in runs and parts[1] in tables
        if wanted and f.type == pafs.FileType.File and f.base_name.endswith(".parquet") and f.base_name[0] != ".":
            out.setdefault(parts[1], []).append(f.path)
    return {table: sorted(paths, key=lambda p: p.split("/")) for table, paths in out.items()}


def render_runs(frame: pl.DataFrame) -> str:
    """`fleet runs`: the listing as an aligned table, newest last."""
    shown = frame.select("run_id", "status", "models", "targets", "gates", "started_at")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=300, fmt_str_lengths=60, tbl_hide_dataframe_shape=True):
        return str(shown) if shown.height else "no runs"


def listed(frame: pl.DataFrame, *, shown: int = 8) -> str:
    """ "3 runs there: a, b, c": what a message about a missing run says the root holds (the newest `shown`)."""
    ids = frame["run_id"].to_list()
    if not ids:
        return "no runs there"
    return f"{len(ids)} runs there: {'..., ' if len(ids) > shown else ''}{', '.join(ids[-shown:])}"


def require_runs(results_root: str | Path, names: Iterable[str], *, what: str) -> None:
    """Every run id in `names` is a run of `results_root`, else a UserError naming the root and its runs."""
    names = sorted(set(names))
    if not names:
        return
    frame = runs(results_root) if is_root(results_root) else pl.DataFrame(schema=RUNS_SCHEMA)
    missing = [name for name in names if name not in set(frame["run_id"])]
    if missing:
        msg = f"{what} {missing[0]!r} is not in {results_root} ({listed(frame)})"
        raise UserError(msg)


def record_verdict(run_dir: str | Path, verdict: str) -> None:
    """Put the gate verdict `fleet run` printed into run.json (and so into the catalog entry
    RunStore.write_info writes with it), so `fleet runs` lists it unread."""
    store.RunStore(run_dir).update_info(gates=verdict)
