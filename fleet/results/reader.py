"""Reading a run back: its run.json and its Parquet tables as lazy Polars frames.

The driver writes through fleet/results/store.py; everything downstream (analysis, query,
reports, compare) reads through here, so there is one place that knows the layout and refuses
files of another schema version.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from fleet.contracts import schema
from fleet.contracts.errors import UserError
from fleet.results import store
from fleet.results.store import RUN_JSON, RunStore


def read_info(run_dir: str | Path) -> dict[str, Any]:
    """run.json of a local run directory or of a URI (s3://bucket/prefix/run_id)."""
    try:
        return RunStore(run_dir).info()
    except FileNotFoundError:
        msg = f"{run_dir}: not a run directory (no {RUN_JSON})"
        raise UserError(msg) from None


def load(run_dir: str | Path) -> dict[str, pl.LazyFrame]:
    """Scan run_dir/<table>/**/*.parquet for requests, tokens and shards (empty, typed frame if none).

    run_dir is a local directory or a URI such as s3://bucket/prefix/run_id (fleet.store.locate)."""
    fs, root = store.locate(run_dir)
    frames: dict[str, pl.LazyFrame] = {}
    for name, arrow_schema in schema.all_tables().items():
        files = store.parquet_files(fs, f"{root}/{name}")
        # Refuse files written under another schema version rather than misread a column.
        with ThreadPoolExecutor(8) as pool:  # one footer each: a round trip per file on S3
            footers = pool.map(lambda f: pq.read_metadata(f, filesystem=fs).metadata or {}, files)
            for file, footer in zip(files, footers, strict=True):
                version = footer.get(b"fleet.schema_version", b"").decode() or None
                if version is not None and version not in schema.READABLE_VERSIONS:
                    where = file if isinstance(fs, pafs.LocalFileSystem) else f"{fs.type_name}://{file}"
                    msg = f"{where}: schema version {version}, this reader understands "
                    msg += ", ".join(schema.READABLE_VERSIONS)
                    raise UserError(msg)
        frame = scan(fs, files) if files else _empty(arrow_schema)
        if "run_id" not in frame.collect_schema().names():  # schema 2: one run per directory, named in run.json
            frame = frame.with_columns(run_id=pl.lit(_run_id(run_dir), pl.String)).select(arrow_schema.names)
        frames[name] = frame
    return frames


def _run_id(run_dir: str | Path) -> str:
    try:
        return str(RunStore(run_dir).info().get("run_id") or run_dir)
    except FileNotFoundError:
        return str(run_dir)


def scan(fs: pafs.FileSystem, files: list[str]) -> pl.LazyFrame:
    """One lazy frame over Parquet files on `fs`: Polars' own reader for local files; for remote
    ones a pyarrow dataset on the same filesystem (endpoint, credentials) that wrote them.
    Directory names are only for humans: every file carries model/target columns itself."""
    if isinstance(fs, pafs.LocalFileSystem):
        return pl.scan_parquet(files, hive_partitioning=False)
    # Polars applies the filters itself: pyarrow's null semantics in comparisons differ.
    return pl.scan_pyarrow_dataset(ds.dataset(files, filesystem=fs, format="parquet"), allow_pyarrow_filter=False)


def _empty(arrow_schema: pa.Schema) -> pl.LazyFrame:
    frame = pl.from_arrow(arrow_schema.empty_table())
    assert isinstance(frame, pl.DataFrame)  # a Table always converts to a DataFrame
    return frame.lazy()
