"""Reading a run back: its run.json and its Parquet tables as lazy Polars frames.

The driver writes through fleet/results/store.py; everything downstream (analysis, query,
reports, compare) reads through here, so there is one place that knows the layout and refuses
files of another schema version.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from fleet.contracts import schema, stored_tables
from fleet.contracts.errors import UserError
from fleet.contracts.inputs import cut
from fleet.results import driver_lock, store
from fleet.results.info import RunInfo
from fleet.results.store import RUN_JSON, RunStore


def read_info(run_dir: str | Path) -> RunInfo:
    """run.json of a local run directory or of a URI (s3://bucket/prefix/run_id), checked for what
    every reader relies on (fleet.results.info.RunInfo). Its status is run.json's, except a run
    recorded `running` that no live driver holds: `interrupted` (fleet/results/driver_lock.py)."""
    where = f"{cut(str(run_dir), 200)}/{RUN_JSON}"
    try:
        stored = RunStore(run_dir).info()
    except FileNotFoundError:
        msg = f"{cut(str(run_dir), 200)}: not a run directory (no {RUN_JSON})"
        raise UserError(msg) from None
    except (NotADirectoryError, IsADirectoryError):
        msg = f"{cut(str(run_dir), 200)}: not a run directory (expected a directory holding {RUN_JSON})"
        raise UserError(msg) from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        msg = f"{where}: not valid JSON ({cut(str(e), 100)}); the run directory is damaged"
        raise UserError(msg) from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        msg = f"{where}: cannot read it: {cut(str(e), 120)}"
        raise UserError(msg) from None
    info = RunInfo.parse(stored, where=where, run_dir=run_dir)
    shown = driver_lock.status(info.status, run_dir)  # `running` with its driver gone: interrupted
    return info if shown == info.status else dataclasses.replace(info, status=shown)


_PANIC: type[BaseException] = getattr(pl.exceptions, "PanicException", pl.exceptions.ComputeError)


@contextlib.contextmanager
def decoding(run_dir: str | Path) -> Iterator[None]:
    """Parquet files of `run_dir` that cannot be decoded (truncated, garbled) are bad input, named
    as such: a damaged run directory, not a crash. Wrap reads of stored tables only."""
    try:
        yield
    # UnicodeDecodeError: garbled string pages; PanicException (a BaseException): Polars' reader
    # unwrapping garbled metadata. Neither is a bug of ours when it comes from a stored file.
    except (pa.ArrowException, pl.exceptions.ComputeError, OSError, UnicodeDecodeError, _PANIC) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = f"{cut(str(run_dir), 200)}: a stored table cannot be read (damaged run directory?): {cut(first, 160)}"
        raise UserError(msg) from None


def load(run_dir: str | Path) -> dict[str, pl.LazyFrame]:
    """Scan run_dir/<table>/**/*.parquet for requests, tokens and shards (empty, typed frame if none).

    run_dir is a local directory or a URI such as s3://bucket/prefix/run_id (fleet.store.locate)."""
    fs, root = store.locate(run_dir)
    frames: dict[str, pl.LazyFrame] = {}
    for name, arrow_schema in stored_tables.all_tables().items():
        files = store.parquet_files(fs, f"{root}/{name}")
        # Refuse files written under another schema version rather than misread a column.
        versions = set()
        for file, footer in zip(files, _footers(fs, files, arrow_schema), strict=True):
            version = footer.get(b"fleet.schema_version", b"").decode(errors="replace") or None
            versions.add(version)
            if version is not None and version not in schema.READABLE_VERSIONS:
                where = file if isinstance(fs, pafs.LocalFileSystem) else f"{fs.type_name}://{file}"
                msg = f"{where}: schema version {version}, this reader understands "
                msg += ", ".join(schema.READABLE_VERSIONS)
                raise UserError(msg)
        frame = scan(fs, files, arrow_schema) if files else empty(arrow_schema)
        if "2" in versions:  # schema 2 had no run_id: one run per directory, named in run.json
            frame = frame.with_columns(pl.col("run_id").fill_null(pl.lit(_run_id(run_dir), pl.String)))
        frames[name] = frame
    return frames


def covers(run_dir: str | Path, table: str, of: str) -> bool:
    """Whether `table` holds a file for each file of `of` and no other (same partition and name):
    prompt_stats written beside every tokens file, which runs from before it lack."""
    fs, root = store.locate(run_dir)

    def names(name: str) -> set[str]:
        return {f.removeprefix(f"{root}/{name}/") for f in store.parquet_files(fs, f"{root}/{name}")}

    return names(table) == names(of)


def narrowed(run_dir: str | Path, table: str, *, index: str, where: pl.Expr) -> pl.LazyFrame | None:
    """A scan of the files of `table` whose namesake in `index` (a small table written beside it,
    file for file: prompt_stats beside tokens, `covers`) holds a row matching `where`: the few
    files that hold some prompts, found without reading the big table's key columns (a string
    filter skips no row group there: every file's ids span the same range). None where the run is
    not a local directory (the caller scans the whole table) or `index` does not cover `table`."""
    fs, root = store.locate(run_dir)
    if not isinstance(fs, pafs.LocalFileSystem) or not covers(run_dir, index, table):
        return None
    files = store.parquet_files(fs, f"{root}/{index}")
    if not files:
        return None
    declared = empty(stored_tables.all_tables()[index]).collect_schema()
    found = (
        pl.scan_parquet(
            files, hive_partitioning=False, schema=declared, missing_columns="insert", include_file_paths="_file"
        )
        .filter(where)
        .select(pl.col("_file").unique())
        .collect()["_file"]
        .to_list()
    )
    tables = [f"{root}/{table}/{f.removeprefix(f'{root}/{index}/')}" for f in sorted(found, key=lambda f: f.split("/"))]
    return scan(fs, tables, stored_tables.all_tables()[table]) if tables else empty(stored_tables.all_tables()[table])


def _footers(fs: pafs.FileSystem, files: list[str], declared: pa.Schema) -> Iterator[dict[bytes, bytes]]:
    """Each file's footer (`_footer`). Remote: a round trip per file, in threads. Local: one after
    another (threads on these small reads measured slower than none: 0.16 s against 0.1 for the
    596 files of a 10M-row run)."""
    read = functools.partial(_footer, fs, declared=declared)
    if isinstance(fs, pafs.LocalFileSystem):
        yield from map(read, files)
        return
    with ThreadPoolExecutor(8) as pool:
        yield from pool.map(read, files)


def _footer(fs: pafs.FileSystem, file: str, declared: pa.Schema) -> dict[bytes, bytes]:
    """A file's key-value metadata, once its footer parses and its columns are the declared ones."""
    where = file if isinstance(fs, pafs.LocalFileSystem) else f"{fs.type_name}://{file}"
    local = _local_footer(file) if isinstance(fs, pafs.LocalFileSystem) else None
    if local is not None:
        footer, found = local
    else:
        try:
            meta = pq.read_metadata(file, filesystem=fs)
            found = meta.schema.to_arrow_schema()
        except (pa.ArrowException, OSError) as e:
            msg = f"{cut(where, 200)}: not a readable Parquet file (truncated or damaged?): {cut(str(e), 120)}"
            raise UserError(msg) from None
        footer = meta.metadata or {}
    same_version = footer.get(b"fleet.schema_version", b"") == str(schema.SCHEMA_VERSION).encode()
    if same_version and [(f.name, f.type) for f in found] != [(f.name, f.type) for f in declared]:
        msg = f"{cut(where, 200)}: its columns are not the {declared.metadata[b'fleet.table'].decode()} table's"
        raise UserError(msg)
    return footer


def _local_footer(file: str) -> tuple[dict[bytes, bytes], pa.Schema] | None:
    """A local file's key-value metadata and the Arrow schema its writer stored there, by Polars'
    footer reader (a third of pyarrow's time: 596 footers of a 10M-row run in 0.04 s, not 0.1);
    None where that fails or the file holds no Arrow schema (then pyarrow reads it, and names
    what is wrong)."""
    try:
        footer = pl.read_parquet_metadata(file)
        found = _arrow_schema(footer["ARROW:schema"])
    except (KeyError, ValueError, OSError, pa.ArrowException, pl.exceptions.PolarsError, _PANIC):
        return None
    return {k.encode(): v.encode() for k, v in footer.items()}, found


@functools.lru_cache(maxsize=64)
def _arrow_schema(stored: str) -> pa.Schema:
    """The Arrow schema a writer stored in a footer, decoded once per distinct text: a run's files
    hold a few (one per table), and decoding each file's took 0.2 s of 5,904 footers at 100M rows."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(stored)))


def _run_id(run_dir: str | Path) -> str:
    try:
        return str(RunStore(run_dir).info().get("run_id") or run_dir)
    except FileNotFoundError:
        return str(run_dir)


def scan(fs: pafs.FileSystem, files: list[str], declared: pa.Schema | None = None) -> pl.LazyFrame:
    """One lazy frame over Parquet files on `fs`: Polars' own reader for local files; for remote
    ones a pyarrow dataset on the same filesystem (endpoint, credentials) that wrote them.
    Directory names are only for humans: every file carries model/target columns itself. With the
    `declared` schema, a column an older schema version lacked reads as nulls."""
    if isinstance(fs, pafs.LocalFileSystem):
        if declared is None:
            return pl.scan_parquet(files, hive_partitioning=False)
        declared_frame = empty(declared)
        return pl.scan_parquet(
            files, hive_partitioning=False, schema=declared_frame.collect_schema(), missing_columns="insert"
        )
    # Polars applies the filters itself: pyarrow's null semantics in comparisons differ.
    import pyarrow.dataset as ds  # imports pandas: 0.2 s no report of a local run needs

    dataset = ds.dataset(files, filesystem=fs, format="parquet", schema=declared)
    return pl.scan_pyarrow_dataset(dataset, allow_pyarrow_filter=False)


def empty(arrow_schema: pa.Schema) -> pl.LazyFrame:
    """A typed frame of no rows: a table no file holds still has its columns."""
    # From the schema alone: building an Arrow array makes pyarrow import pandas (0.3 s of a report).
    return pl.DataFrame(schema=pl.Schema(arrow_schema)).lazy()
