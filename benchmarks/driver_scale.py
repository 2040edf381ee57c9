"""The driver at fleet scale, with the TEST-DOUBLE backend (no model runs; these figures are the
harness's own, never a model's). Every model has a reference and a candidate target (two actors),
so each candidate shard is also scored by the reference, the calls a real run makes. Prints,
measured in one run:

  1. dispatch: shards/s dispatched, gathered and written by 32 actors with zero-cost shards;
  2. writing: token rows/s written to Parquet by the store (atomic files, zstd);
  3. scaling: throughput with N actors / (N x throughput with one), each actor's shards taking
     a fixed time (sleeping, so 2 cores can host 32 actors without the engine eating them).

    .venv/bin/python benchmarks/driver_scale.py [--actors 32] [--shards 2000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))


def manifest(tmp: Path, *, models: int, prompts: int, shard_size: int, tokens: int, seconds_per_token: float) -> Path:
    """`models` models with a test-double reference and a test-double candidate: two actors per model."""
    lines = "\n".join(f"  - {{name: m{i}, source: {{kind: synthetic, seed: 1}}}}" for i in range(models))
    rows = "\n".join(f'    - {{id: q{i}, prompt: "q {i}"}}' for i in range(prompts))
    text = textwrap.dedent(
        """
        models:
        {lines}
        prompts:
          p:
        {rows}
        targets:
          - {{name: ref, kind: test-double, num_cpus: 0.05, seconds_per_token: {spt}}}
          - {{name: cand, kind: test-double, num_cpus: 0.05, seconds_per_token: {spt}, logprob_shift: 0.01}}
        reference: ref
        sampling: {{max_tokens: {tokens}, logprobs: 5}}
        run: {{shard_size: {size}}}
        """
    ).format(lines="LINES", rows="ROWS", spt=seconds_per_token, tokens=tokens, size=shard_size)
    path = tmp / f"m-{models}-{prompts}-{seconds_per_token}.yaml"
    path.write_text(text.replace("LINES", lines).replace("ROWS", rows))
    return path


def timed_run(path: Path, results: Path) -> tuple[float, float, int]:
    """(shards/s summed over actors, each from its first shard's start to its last one's end;
    shards/s over the whole span; shards). Actor start-up (a Python worker each, ~1 s apiece on 2
    cores, staggered) is Ray's, not the driver's, so the first figure leaves it out."""
    import polars as pl

    from fleet.results import reader
    from fleet.run import driver

    run_dir, outcome = driver.run(path, results_dir=results, progress=False)
    assert not outcome.partial, outcome
    shards = (
        reader.load(run_dir)["shards"]
        .collect()
        .with_columns(end=pl.col("started_at") + pl.duration(seconds=pl.col("wall_s")))
    )
    per_actor = shards.group_by("model", "target").agg(
        n=pl.len(), span=(pl.col("end").max() - pl.col("started_at").min()).dt.total_microseconds() / 1e6
    )
    busy_rate = float((per_actor["n"] / per_actor["span"]).sum())
    whole = (shards["end"].max() - shards["started_at"].min()).total_seconds()  # type: ignore[operator, union-attr]
    return busy_rate, shards.height / whole, shards.height


def write_rate(tmp: Path, *, shards: int, prompts: int, tokens: int) -> float:
    """Token rows/s through RunStore.write (atomic, fsynced, zstd), on test-double generations."""
    from actors.test_double import TestDoubleEngine
    from fleet.contracts.backend_args import TestDoubleArgs
    from fleet.contracts.engine import ResolvedModel
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.sources import SyntheticSource
    from fleet.contracts.spec import ModelSpec, Sampling, Shard
    from fleet.results.store import RunStore

    model = ResolvedModel(ModelSpec(name="m", source=SyntheticSource()), tmp, "w" * 16, None)
    engine = TestDoubleEngine(TestDoubleArgs(name="td"), model, sampling=Sampling(max_tokens=tokens, logprobs=5))
    prompts_ = tuple(Prompt(id=f"q{i}", prompt=f"q {i}") for i in range(prompts))
    gens = [engine.generate(Shard("m", "td", "p", i, prompts_)) for i in range(shards)]
    store = RunStore.create(tmp / "writes", {})
    t0 = time.perf_counter()
    # As the scheduler writes: 4 writer threads (zstd and fsync release the GIL).
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda i: store.write("tokens", f"m/td/p/{i:05d}", gens[i].tokens), range(len(gens))))
    return sum(g.tokens.num_rows for g in gens) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=32)
    parser.add_argument("--shards", type=int, default=2000, help="zero-cost shards for the dispatch figure")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["FLEET_ALLOW_TEST_DOUBLE"] = "1"  # its manifests run the labelled test double
    import ray

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    os.environ["FLEET_CACHE"] = str(tmp / "cache")
    # Logical CPU slots: the actors sleep or do next to nothing; the driver is what is measured.
    ray.init(address="local", num_cpus=args.actors, include_dashboard=False, log_to_driver=False)
    print(f"test-double backend, {args.actors} actors max, {os.cpu_count()} cores; command: {' '.join(sys.argv)}")

    per_actor = max(1, args.shards // args.actors)
    _, rate, n = timed_run(
        manifest(
            tmp, models=max(1, args.actors // 2), prompts=per_actor, shard_size=1, tokens=1, seconds_per_token=0.0
        ),
        tmp / "r",
    )
    print(
        f"1. dispatch: {n} zero-cost shards over {args.actors} actors: {rate:,.0f} shards/s dispatched, "
        "scored (candidates), gathered and written"
    )

    rows = write_rate(tmp, shards=50, prompts=16, tokens=256)
    print(f"2. writing: {rows:,.0f} token rows/s to Parquet (50 shards x 16 prompts x 256 tokens; target >= 1M)")

    # Each shard: 4 prompts x 16 tokens x 5 ms = 0.32 s of (sleeping) engine time; 15 per actor.
    base = None
    for n_actors in sorted({2, 4, 16, args.actors}):
        busy, whole, n = timed_run(
            manifest(tmp, models=n_actors // 2, prompts=60, shard_size=4, tokens=16, seconds_per_token=0.005),
            tmp / "r",
        )
        base = base or busy / n_actors  # one actor's rate, from the smallest run
        print(
            f"3. scaling: {n_actors:3d} actors, {n:4d} shards: {busy:7.2f} shards/s while busy, "
            f"efficiency {busy / (n_actors * base):.3f} (target >= 0.95); {whole:6.2f} shards/s over the whole span"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
