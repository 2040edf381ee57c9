"""The driver at dataset scale, with the TEST-DOUBLE backend (no model runs; these figures are
the harness's own): a Parquet prompt file of 10k, 100k and 1M rows (GSM8K-shaped, mapped by
columns) through the whole pipeline, a test-double reference and candidate per model, so every
candidate shard is scored too. Each size runs in a fresh driver process; printed per size:

  - driver peak RSS (the driver process alone: ru_maxrss), against the smallest size;
  - token rows written and token rows/s, from the first shard's start to the last shard's end
    (the shards table), and over the whole run (manifest check, Ray start and shutdown included);
  - the driver process's CPU seconds per million token rows (all its threads, the whole run), the
    actors' and Ray's own processes not counted: what one driver core can take is 1M rows/s over it
    (on 2 cores the actors' share of the work, encoding included, comes out of the same cores);

then, in this process on one shard of the same shape (test-double rows, no Ray), what each step
of a shard's path costs, in the actors and in the driver: CPU seconds per million token rows, best of 7.

    .venv/bin/python benchmarks/prompt_scale.py [--sizes 10000 100000 1000000] [--shard-size 2000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))


def prompt_file(path: Path, n: int) -> Path:
    """`n` GSM8K-shaped rows (idx, question, answer "... #### k"), written in row groups of 50k."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetWriter(path, pa.schema({"idx": pa.int64(), "question": pa.string(), "answer": pa.string()})) as w:
        for lo in range(0, n, 50_000):
            ids = range(lo, min(lo + 50_000, n))
            w.write_table(
                pa.table(
                    {
                        "idx": list(ids),
                        "question": [f"Sam has {i} apples and buys 3 more. How many apples now?" for i in ids],
                        "answer": [f"{i} + 3 = {i + 3}\n#### {i + 3}" for i in ids],
                    }
                )
            )
    return path


def manifest(tmp: Path, data: Path, *, shard_size: int, tokens: int) -> Path:
    path = tmp / f"{data.stem}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            models: [{{name: m, source: {{kind: synthetic, seed: 1}}}}]
            prompts:
              gsm: {{file: {data}, id: idx, prompt: question, expected: {{number: answer}}}}
            targets:
              - {{name: ref, kind: test-double, num_cpus: 0.5}}
              - {{name: cand, kind: test-double, num_cpus: 0.5, logprob_shift: 0.01}}
            reference: ref
            sampling: {{max_tokens: {tokens}, logprobs: 5}}
            run: {{shard_size: {shard_size}}}
            """
        )
    )
    return path


def one(path: Path, results: Path) -> dict[str, float]:
    """Run one manifest in this process; what the parent prints."""
    import polars as pl

    from fleet.results import reader
    from fleet.run import driver

    t0, cpu = time.perf_counter(), time.process_time()
    run_dir, outcome = driver.run(path, results_dir=results, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu
    assert not outcome.partial, outcome
    shards = reader.load(run_dir)["shards"].select("started_at", "wall_s", "n_output_tokens").collect()
    end = shards.select((pl.col("started_at") + pl.duration(seconds=pl.col("wall_s"))).max()).item()
    span = (end - shards["started_at"].min()).total_seconds()
    rows = int(shards["n_output_tokens"].sum())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {"rows": rows, "span_s": span, "wall_s": wall, "peak_rss_mb": peak_mb, "cpu_s": cpu}


def stages(tmp: Path, *, prompts: int, tokens: int) -> dict[str, dict[str, float]]:
    """CPU seconds per million token rows of each step a shard of `prompts` x `tokens` rows (test
    double, top-5) takes on the driver path, best of 7: in the actors (the reference's for a
    candidate shard: fleet/results/packed.py), the scores joined on, prompt_stats computed and each
    table encoded; in the driver, the encoded files stored (atomic, fsynced) and the shards row."""
    from driver_steps import shard

    from fleet.results import prompt_rows
    from fleet.results.packed import PackSink
    from fleet.results.scores import join_scores
    from fleet.results.store import RunStore, encoded, stamped
    from fleet.run.writer import keep_freed_memory

    keep_freed_memory()  # as the driver's writer has it (benchmarks/driver_steps.py: with and without)
    gen, scores, scored = shard(tmp, prompts=prompts, tokens=tokens)
    stats = prompt_rows.summarize(scored)
    packed = PackSink("stages", reference="cand").generated(type(gen)(gen.requests, scored, gen.shard))
    store = RunStore.create(tmp / "stages", {"run_id": "stages"})
    shard_id = "m/cand/p/00000"
    actor = {
        "join the reference's scores": lambda: join_scores(gen.tokens, scores),
        "prompt_stats of a candidate shard": lambda: prompt_rows.summarize(scored),
        "prompt_stats of a reference shard": lambda: prompt_rows.summarize(gen.tokens),
        "encode requests": lambda: encoded(stamped("requests", gen.requests, "stages")),
        "encode tokens": lambda: encoded(stamped("tokens", scored, "stages")),
        "encode prompt_stats": lambda: encoded(stamped("prompt_stats", stats, "stages")),
    }
    driver = {
        f"store the encoded {table}": (lambda t=table: store.put_encoded(t, shard_id, *packed.files[t]))
        for table in ("requests", "tokens", "prompt_stats")
    } | {"write the shards row": lambda: store.write("shards", shard_id, gen.shard)}
    out: dict[str, dict[str, float]] = {"actor": {}, "driver": {}}
    for where, steps in (("actor", actor), ("driver", driver)):
        for name, step in steps.items():
            best = math.inf
            for _ in range(7):
                t0 = time.process_time()
                step()
                best = min(best, time.process_time() - t0)
            out[where][name] = best / gen.tokens.num_rows * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--shard-size", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated per prompt")
    parser.add_argument("--one", nargs=2, metavar=("MANIFEST", "RESULTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["FLEET_ALLOW_TEST_DOUBLE"] = "1"  # its manifests run the labelled test double
    if args.one:
        print(json.dumps(one(Path(args.one[0]), Path(args.one[1]))))
        return
    tmp = Path(tempfile.mkdtemp(prefix="fleet-scale-"))
    env = os.environ | {"FLEET_CACHE": str(tmp / "cache"), "PYTHONPATH": str(ROOT)}
    print(
        f"test-double reference + candidate, {args.tokens} tokens per prompt, shard_size {args.shard_size}, "
        f"{os.cpu_count()} cores; command: {' '.join(sys.argv)}"
    )
    base = None
    for n in args.sizes:
        path = manifest(tmp, prompt_file(tmp / f"gsm-{n}.parquet", n), shard_size=args.shard_size, tokens=args.tokens)
        out = (
            subprocess.run(
                [sys.executable, __file__, "--one", str(path), str(tmp / "results")],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        r = json.loads(out)
        base = base or r["peak_rss_mb"]
        print(
            f"{n:>9,} prompts: driver peak RSS {r['peak_rss_mb']:7.1f} MB ({r['peak_rss_mb'] / base:.2f}x the first; "
            f"goal <= 2x at 1M), {r['rows']:>10,} token rows, {r['rows'] / r['span_s']:>10,.0f} token rows/s "
            f"while dispatching (goal >= 1M), {r['rows'] / r['wall_s']:>10,.0f} over the whole run "
            f"({r['wall_s']:.1f} s); driver CPU {r['cpu_s'] / r['rows'] * 1e6:.2f} s per M rows",
            flush=True,
        )
    per_row = stages(tmp, prompts=args.shard_size, tokens=args.tokens)
    print(f"one shard's steps ({args.shard_size} prompts x {args.tokens} tokens), CPU s per M rows:")
    for where, steps in per_row.items():
        for name, cost in steps.items():
            print(f"  {where:<6} {name:<36} {cost:6.3f}")
    # The reference's actor, for a candidate shard: not the reference's own summary, nor the
    # requests, which the candidate's actor encoded.
    elsewhere = ("prompt_stats of a reference shard", "encode requests")
    cand = sum(cost for name, cost in per_row["actor"].items() if name not in elsewhere)
    stored = sum(per_row["driver"].values())
    print(f"  a candidate shard in the reference's actor {cand:6.3f}; in the driver {stored:6.3f}:", end=" ")
    print(f"{1e6 / stored:,.0f} rows/s on one core")


if __name__ == "__main__":
    main()
