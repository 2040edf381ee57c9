"""A results root (the directory, or s3:// prefix, that holds run directories) as one data set:
the runs it holds (`fleet runs`) and every stored table of every run stacked on `run_id`
(`fleet query RESULTS_ROOT`).

Only run.json files are read to list runs; the tables stay lazy scans of the runs' Parquet
files, so a query reads only the columns and row groups it needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.fs as pafs

from fleet.contracts.errors import UserError
from fleet.results import reader, store
from fleet.results.info import RunInfo
from fleet.results.store import RUN_JSON

RUNS_SCHEMA = {
    "run_id": pl.String,
    "status": pl.String,
    "models": pl.String,
    "targets": pl.String,
    "reference": pl.String,
    "gates": pl.String,
    "started_at": pl.String,
    "finished_at": pl.String,
    "schema_version": pl.Int64,
    "run_dir": pl.String,
}


def is_run(where: str | Path) -> bool:
    fs, root = store.locate(where)
    return fs.get_file_info(f"{root}/{RUN_JSON}").type == pafs.FileType.File


def run_dirs(results_root: str | Path) -> list[str | Path]:
    """Every run directory directly under `results_root` (one holding a run.json), by name."""
    fs, root = store.locate(results_root)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        msg = f"{results_root}: no such results directory"
        raise UserError(msg)
    subdirs = sorted(d.base_name for d in fs.get_file_info(pafs.FileSelector(root)) if d.type == pafs.FileType.Directory)
    found = fs.get_file_info([f"{root}/{name}/{RUN_JSON}" for name in subdirs])
    return [store.join(results_root, name) for name, f in zip(subdirs, found, strict=True) if f.type == pafs.FileType.File]


def runs(results_root: str | Path) -> pl.DataFrame:
    """One row per run: id, status, models, targets, gate verdict (as `fleet run` recorded it), times."""
    rows = [_summary(reader.read_info(d), d) for d in run_dirs(results_root)]
    return pl.DataFrame(rows, schema=RUNS_SCHEMA).sort("started_at", nulls_last=True)


def _summary(info: RunInfo, run_dir: str | Path) -> dict[str, Any]:
    return {
        "run_id": info.run_id,
        "status": info.status,
        "models": ", ".join(info.model_names),
        "targets": ", ".join(t["name"] for t in info.targets),
        "reference": info.reference,
        "gates": info.gates or "not recorded",
        "started_at": info.started_at,
        "finished_at": info.finished_at,
        "schema_version": info.schema_version,
        "run_dir": str(run_dir),
    }


def stacked(results_root: str | Path) -> dict[str, pl.LazyFrame]:
    """Every stored table of every run under `results_root`, stacked (each row has its run_id),
    plus `runs`. Tables only some runs have are stacked from those."""
    frames: dict[str, list[pl.LazyFrame]] = {}
    for run_dir in run_dirs(results_root):
        for name, frame in reader.load(run_dir).items():
            frames.setdefault(name, []).append(frame)
    out = {name: pl.concat(parts, how="diagonal_relaxed") for name, parts in frames.items()}
    return out | {"runs": runs(results_root).lazy()}


def render_runs(frame: pl.DataFrame) -> str:
    """`fleet runs`: the listing as an aligned table, newest last."""
    shown = frame.select("run_id", "status", "models", "targets", "gates", "started_at")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=300, fmt_str_lengths=60, tbl_hide_dataframe_shape=True):
        return str(shown) if shown.height else "no runs"


def record_verdict(run_dir: str | Path, verdict: str) -> None:
    """Put the gate verdict `fleet run` printed into run.json, so `fleet runs` lists it unread."""
    store.RunStore(run_dir).update_info(gates=verdict)

