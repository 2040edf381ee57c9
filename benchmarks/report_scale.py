"""`fleet report` over runs of 10 and 100 million token rows, built from a real run by replication:
every prompt of the source run's parity tables is copied under new ids (`<id>~<k>`) until the
tokens table holds `--rows` rows; the other tables are copied once. Then `fleet report --top 20`
runs in a fresh process, `--calls` times (3: one call's time varies by a tenth on a busy machine);
printed per size: each call's wall time and peak RSS, their median and range, and the data's size
(Parquet on disk, and the tokens table in memory as Arrow, estimated from one replica batch).
Each replicated run is deleted once measured (100M rows take a quarter of an hour to build on 2 busy
cores), unless `--keep DIR` builds it there, or reuses what an earlier call built there.

    .venv/bin/python benchmarks/report_scale.py SOURCE_RUN [--rows 10000000 100000000] [--calls 3]

First, the source run's figures from its prompt_stats (what the report reads at scale) are compared
with the same figures from its token rows, within docs/metrics.md's tolerance, and printed: on a
`make demo` run, the aggregates against the exact figures of the demo's own rows.

SOURCE_RUN: a finished run directory (e.g. one of `make demo`). A run from before prompt_stats (or
from before one of its columns) gets them computed from its token rows (as its shards would write them today); with
`--no-prompt-stats` the copy has none, and the report reads token rows (the path older runs take).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

if TYPE_CHECKING:
    import polars as pl

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))
PARITY = ("requests", "tokens", "prompt_stats", "shards")


def replicate(source: Path, dest: Path, *, rows: int, batch: int = 256, stats: bool = True) -> tuple[int, int, float]:
    """Write the replicated run to `dest`; (token rows, prompts per target, tokens' Arrow bytes)."""
    import polars as pl

    from fleet.results import reader
    from fleet.results.store import RunStore

    info = RunStore(source).info()  # run.json as stored: the copy keeps every field
    tables = {name: frame.collect() for name, frame in reader.load(source).items()}
    # A run from before prompt_stats, or from before a column of it: summarized as a shard is today.
    newest = ("ref_top1_in_topk", "tf_positions")  # the last columns each schema version added
    if stats and any(tables["prompt_stats"][c].null_count() == tables["prompt_stats"].height for c in newest):
        tables["prompt_stats"] = summarized(source)
    if not stats:
        del tables["prompt_stats"]
    store = RunStore.create(dest, info | {"run_id": dest.name})
    for name, frame in tables.items():
        if name not in PARITY and frame.height:
            for i, ((model, target), part) in enumerate(frame.group_by("model", "target")):
                store.write(name, f"{model}/{target}/copy/{i:05d}", part.to_arrow())
    copies = -(-rows // tables["tokens"].height)
    arrow_bytes = 0.0
    for first in range(0, copies, batch):
        ks = pl.DataFrame({"_k": list(range(first, min(first + batch, copies)))})
        for name in (p for p in PARITY if p in tables):
            frame = tables[name].join(ks, how="cross")
            key = "shard_id" if name == "shards" else "prompt_id"
            frame = frame.with_columns(pl.col(key) + "~" + pl.col("_k").cast(pl.String)).drop("_k")
            if "shard_id" in frame.columns and name != "shards":
                frame = frame.with_columns(pl.col("shard_id") + "~" + pl.col(key).str.split("~").list.last())
            for (model, target), part in frame.group_by("model", "target"):
                store.write(name, f"{model}/{target}/copy/{first // batch:05d}", part.to_arrow())
            if name == "tokens":
                arrow_bytes += frame.to_arrow().nbytes
    store.update_info(status="complete")
    prompts = tables["requests"].group_by("target").len()["len"].max()
    return copies * tables["tokens"].height, int(prompts) * copies, arrow_bytes  # type: ignore[arg-type]


def summarized(source: Path) -> pl.DataFrame:
    """The source run's prompt_stats as its shards write them today: one tokens file at a time
    (a shard's aggregates, the |dlogp| floor among them, are the shard's own)."""
    import polars as pl

    from fleet.results import prompt_rows

    files = sorted((source / "tokens").rglob("*.parquet"))
    return pl.concat(pl.DataFrame(prompt_rows.summarize(pq.read_table(f))) for f in files)


def measure(
    source: Path, rows: int, top: int, *, stats: bool, keep: Path | None = None, calls: int = 3
) -> list[dict[str, float]]:
    """Build a run of `rows` token rows, time `fleet report` on it `calls` times, print and delete it
    (`keep`: build it under that directory, or reuse the one built there before, and leave it)."""
    tmp = keep or Path(tempfile.mkdtemp(prefix="fleet-report-scale-"))
    dest = tmp / (f"rows-{rows}" if stats else f"rows-{rows}-tokens") if keep else tmp / "replicated"
    try:
        t0 = time.perf_counter()
        if (dest / "run.json").is_file():  # built by an earlier --keep call
            n_rows = sum(pq.read_metadata(f).num_rows for f in (dest / "tokens").rglob("*.parquet"))
            print(f"reusing {dest}: {n_rows:,} token rows", flush=True)
        else:
            shutil.rmtree(dest, ignore_errors=True)  # a build cut short
            n_rows, n_prompts, arrow_bytes = replicate(source, dest, rows=rows, stats=stats)
            disk = sum(f.stat().st_size for f in dest.rglob("*.parquet"))
            print(
                f"built {dest}: {n_rows:,} token rows ({n_prompts:,} prompts per target) from {source} "
                f"in {time.perf_counter() - t0:.0f} s; Parquet {disk / 1e6:,.1f} MB on disk, "
                f"tokens {arrow_bytes / 1e6:,.0f} MB as Arrow in memory",
                flush=True,
            )
        done = [report_once(dest, n_rows, top, stats=stats) for _ in range(calls)]
        if calls > 1:
            walls, peaks = sorted(d["wall_s"] for d in done), sorted(d["peak_rss_mib"] for d in done)
            print(
                f"  {calls} calls at {n_rows:,} rows: median {statistics.median(walls):.1f} s "
                f"({walls[0]:.1f}-{walls[-1]:.1f}), peak RSS median {statistics.median(peaks):,.0f} MiB "
                f"({peaks[0]:,.0f}-{peaks[-1]:,.0f})",
                flush=True,
            )
        return done
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def report_once(dest: Path, n_rows: int, top: int, *, stats: bool) -> dict[str, float]:
    """`fleet report --top` on `dest` in a fresh process: its wall time and peak RSS, printed."""
    command = [sys.executable, "-m", "fleet", "report", str(dest), "--top", str(top)]
    # /usr/bin/time measures this child alone (RUSAGE_CHILDREN would keep the largest of all sizes).
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *command],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    wall = time.perf_counter() - t0
    peak = int(proc.stderr.strip().splitlines()[-1]) / 1024  # time's %M is in KiB
    lines = proc.stdout.count("\n")
    print(
        f"fleet report --top {top} at {n_rows:,} rows ({'prompt_stats' if stats else 'token rows'}): "
        f"{wall:.1f} s, peak RSS {peak:,.0f} MiB ({peak * 1.048576:,.0f} MB), {lines:,} lines printed, "
        f"exit {proc.returncode}",
        flush=True,
    )
    if proc.returncode not in (0, 3, 4):
        print(proc.stderr[-2000:])
    return {"wall_s": wall, "peak_rss_mib": peak, "token_rows": n_rows, "lines": lines}


def agreement(source: Path) -> bool:
    """Print whether the source run's figures from its prompt_stats (what the report reads) agree
    with those from its token rows, within the tolerance docs/metrics.md states (1e-9 relative,
    1e-12 absolute: only the order of additions differs); the largest relative difference of each."""
    from polars.testing import assert_frame_equal

    from fleet.analysis.noise_model import NoiseSpec
    from fleet.report import figures
    from fleet.results import reader

    info, scans = reader.read_info(source), reader.load(source)
    if not reader.covers(source, "prompt_stats", "tokens"):
        print(f"{source}: no prompt_stats beside every tokens file: nothing to compare")
        return True
    requests, spec = scans["requests"].collect(), NoiseSpec.from_info(info)
    exact = figures.from_token_rows(requests, scans["tokens"], info.reference, spec)
    merged = figures.from_prompt_stats(requests, scans["prompt_stats"], info.reference, spec)
    agreed = True
    for name, a, b in zip(("parity", "first step", "divergences", "sequences"), exact, merged, strict=True):
        try:
            assert_frame_equal(a, b, check_exact=False, rel_tol=1e-9, abs_tol=1e-12)
            same = True
        except AssertionError:
            same = agreed = False
        numbers = [c for c, t in a.schema.items() if t.is_float() and c in b.columns] if a.height == b.height else []
        worst = max(
            (
                float(((a[c] - b[c]).abs() / a[c].abs().clip(lower_bound=1e-300)).fill_nan(None).max() or 0.0)
                for c in numbers
            ),
            default=0.0,
        )
        print(
            f"  {name}: {a.height:,} rows, from prompt_stats {'agree' if same else 'DIFFER'} with token rows "
            f"(largest relative difference {worst:.1e})",
            flush=True,
        )
    return agreed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000_000, 100_000_000])
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--no-prompt-stats", dest="stats", action="store_false")
    parser.add_argument("--keep", type=Path, help="build the runs under this directory and keep them (reused if there)")
    parser.add_argument(
        "--calls", type=int, default=3, help="reports per size, each printed, then their median (one call varies)"
    )
    args = parser.parse_args()
    print(f"the figures of {args.source}, from its prompt_stats against its token rows:", flush=True)
    if not agreement(args.source):
        raise SystemExit("the figures from prompt_stats differ from those from token rows")
    results = [
        measure(args.source, rows, args.top, stats=args.stats, keep=args.keep, calls=args.calls) for rows in args.rows
    ]
    print("goals: <= 2 s and < 1 GB at 10M token rows, <= 15 s at 100M")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
