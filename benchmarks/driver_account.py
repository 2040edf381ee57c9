"""Where the driver's CPU goes in a whole run on the driver path, TEST-DOUBLE backend (no model
runs; these figures are the harness's own), an earlier commit's code against this checkout's.

The run is benchmarks/prompt_scale.py's (a GSM8K-shaped Parquet prompt file, a test-double
reference and candidate, every candidate shard scored, every row written by the driver), in a
fresh driver process per round, the two sides alternated (before, after, after, before: fleet's
benchmarks' rule, benchmarks/_common.py). Printed per round, CPU seconds of the driver process:

  - the prompt file's check (manifest load), and Python's cycle collections before the dispatch loop;
  - the dispatch loop and its writes (all threads, from the loop's start to its end): what the
    1M token rows/s goal of issue 23.2 asks one driver core to take, so <= 1 s per M rows;
  - of which the writer threads (storing the files, fsync; before 76a4925 also prompt_stats and
    the Parquet encoding) and the main thread's dispatch (Ray's calls, their arguments serialised
    and results deserialised; before 76a4925 also the scores' join);
  - the whole process (imports, Ray's start and shutdown included).

    .venv/bin/python benchmarks/driver_account.py [--before 188e0c6] [--prompts 200000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

# The driver path as its third pass on issue 23.2 left it, the driver encoding every row (docs/measurements.md).
BEFORE = "188e0c6"


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, by name (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for thread in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[thread.name] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def one(manifest: Path, results: Path) -> dict[str, Any]:
    """One run in this process, the phases timed by wrapping the driver's own functions (the same
    names on both sides); returns what the parent prints."""
    import gc

    from fleet.contracts import prompt_source
    from fleet.run import driver, prompt_files, scheduler, writer

    acc: dict[str, Any] = {"check": 0.0, "gc_before_loop": 0.0}
    started: dict[int, float] = {}

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[threading.get_ident()] = time.thread_time()
        elif "loop_start" not in acc:
            acc["gc_before_loop"] += time.thread_time() - started.pop(threading.get_ident(), time.thread_time())

    check, run, stop = prompt_source.check, scheduler.Loop.run, writer.ShardWriter.stop

    def timed_check(source: Any) -> Any:
        t0 = time.process_time()
        try:
            return check(source)
        finally:
            acc["check"] += time.process_time() - t0

    def timed_run(self: Any) -> Any:
        acc["loop_start"] = time.process_time()
        try:
            return run(self)
        finally:
            acc["loop"] = time.process_time() - acc.pop("loop_start")

    def stopped(self: Any) -> None:
        self.wait()
        acc["threads"] = thread_cpu()  # the writer threads are still alive here
        stop(self)

    gc.callbacks.append(collected)
    prompt_files.check = timed_check  # type: ignore[attr-defined]
    scheduler.Loop.run = timed_run  # type: ignore[method-assign]
    writer.ShardWriter.stop = stopped  # type: ignore[method-assign]
    t0 = time.process_time()
    _, outcome = driver.run(manifest, results_dir=results, progress=False)
    acc["process"] = time.process_time() - t0
    assert not outcome.partial, outcome
    threads = acc.pop("threads")
    acc["writers"] = sum(cpu for name, cpu in threads.items() if name.startswith("fleet-write"))
    acc["main"] = threads.get("MainThread", 0.0)
    return acc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=BEFORE, help="the commit to compare against")
    parser.add_argument("--prompts", type=int, default=200_000)
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated per prompt")
    parser.add_argument("--shard-size", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--one", nargs=2, metavar=("MANIFEST", "RESULTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["FLEET_ALLOW_TEST_DOUBLE"] = "1"  # its manifests run the labelled test double
    if args.one:
        print(json.dumps(one(Path(args.one[0]), Path(args.one[1]))))
        return
    import prompt_scale

    tmp = Path(tempfile.mkdtemp(prefix="fleet-account-"))
    before = tmp / "before"
    before.mkdir()
    archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
    data = prompt_scale.prompt_file(tmp / f"gsm-{args.prompts}.parquet", args.prompts)
    manifest = prompt_scale.manifest(tmp, data, shard_size=args.shard_size, tokens=args.tokens)
    rows = 2 * args.prompts * args.tokens  # the reference's own rows and the candidate's
    print(
        f"{args.prompts:,} prompts x {args.tokens} tokens, test-double reference + candidate, {rows:,} token rows "
        f"through the driver, shard_size {args.shard_size}, {os.cpu_count()} cores; before: {args.before}, "
        f"after: this checkout; command: {' '.join(sys.argv)}"
    )
    print("driver CPU s per M token rows: check | collections before the loop | loop (writers + main) | process")
    for r in range(args.rounds):
        side, tree = [("before", before), ("after", ROOT)][(r % 4) in (1, 2)]
        env = os.environ | {"FLEET_CACHE": str(tmp / "cache"), "PYTHONPATH": str(tree)}
        results = tmp / f"results-{r}"
        load = os.getloadavg()[0]
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(manifest), str(results)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        a = json.loads(out.stdout.strip().splitlines()[-1])
        per_m = {k: v / rows * 1e6 for k, v in a.items()}
        print(
            f"  {side:<6} (load {load:.2f}) check {per_m['check']:.3f} ({a['check'] / args.prompts * 1e6:.1f} us a "
            f"prompt) | {per_m['gc_before_loop']:.3f} | loop {per_m['loop']:.3f} (writers {per_m['writers']:.3f}, "
            f"rest {per_m['loop'] - per_m['writers']:.3f}): {1e6 / per_m['loop']:,.0f} rows/s on one core "
            f"| process {per_m['process']:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
