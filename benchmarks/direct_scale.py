"""Engines that write their own rows (run.write: actors, fleet/results/direct.py) against the
driver path, with the TEST-DOUBLE backend (no model runs; these figures are the harness's own):
1, 2 and 4 actors, each a model's only target (its reference), generating shards of token rows as
fast as numpy makes them, stored by the driver or by the actors themselves. Printed per run:

  - token rows/s from the first shard's start to the last commit (actor start-up left out: Ray's,
    not the data path's), and the driver process's CPU seconds per million rows;

and, against a moto S3 server started here (`--s3`), what committing one shard's tokens file
costs the driver: a server-side copy (the direct path's move), against the driver PUTting it.

    .venv/bin/python benchmarks/direct_scale.py [--actors 1 2 4] [--prompts 4000] [--shard-size 500] [--s3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))


def manifest(tmp: Path, *, actors: int, prompts: int, shard_size: int, tokens: int, write: str) -> Path:
    """`actors` models, each with one test-double target, its reference: one actor per model."""
    models = "\n".join(f"  - {{name: m{i}, source: {{kind: synthetic, seed: 1}}}}" for i in range(actors))
    path = tmp / f"direct-{actors}-{write}.yaml"
    body = textwrap.dedent(
        f"""
        prompts:
          p: {{file: {tmp / "prompts.jsonl"}, id: id, prompt: prompt}}
        targets:
          - {{name: ref, kind: test-double, num_cpus: {1 / actors}}}
        reference: ref
        sampling: {{max_tokens: {tokens}, logprobs: 5}}
        run: {{shard_size: {shard_size}, write: {write}}}
        """
    )
    path.write_text(f"models:\n{models}\n{body}")
    prompt_file = tmp / "prompts.jsonl"
    if not prompt_file.exists():
        prompt_file.write_text("".join(f'{{"id": "q{i}", "prompt": "question {i}"}}\n' for i in range(prompts)))
    return path


def timed_run(path: Path, results: Path) -> tuple[int, float, float]:
    """(token rows, rows/s from the first shard's start to the run's end, driver CPU s)."""
    import datetime as dt

    from fleet.results import reader
    from fleet.run import driver

    cpu = time.process_time()
    run_dir, outcome = driver.run(path, results_dir=results, progress=False)
    end, cpu = dt.datetime.now(dt.UTC), time.process_time() - cpu
    assert not outcome.partial, outcome
    shards = reader.load(run_dir)["shards"].select("started_at", "n_output_tokens").collect()
    rows = int(shards["n_output_tokens"].sum())
    return rows, rows / (end - shards["started_at"].min()).total_seconds(), cpu


@contextlib.contextmanager
def moto() -> Iterator[None]:
    """s3://bucket on a moto server on loopback, for this process (as tests/test_s3.py starts it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.1)
        os.environ |= {"FLEET_S3_ENDPOINT": f"http://127.0.0.1:{port}", "AWS_EC2_METADATA_DISABLED": "true"}
        os.environ |= {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}
        import pyarrow.fs as pafs

        pafs.S3FileSystem(endpoint_override=f"http://127.0.0.1:{port}", allow_bucket_creation=True).create_dir("bench")
        yield
    finally:
        server.terminate()
        server.wait(timeout=30)


def s3_commit(tmp: Path, *, rows: int) -> None:
    """Driver seconds to commit one shard's tokens file on S3: move (server-side copy + delete)
    against writing it from the driver (encode + PUT), median of 9."""
    import statistics

    import pyarrow as pa
    import pyarrow.parquet as pq

    from fleet.results.store import READY, RunStore

    files = sorted((tmp / "r").glob("*actors*/tokens/**/*.parquet"))
    table = pq.read_table(files[0])
    while table.num_rows < rows:
        table = pa.concat_tables([table, table])
    table = table.slice(0, rows)
    shard = table.column("model")[0].as_py() + "/ref/p/00000"
    with moto():
        store = RunStore.create("s3://bench/run", {"run_id": "run"})
        moves, puts = [], []
        for _ in range(9):
            ready = str(store.write("tokens", shard, table, area=READY))
            t0 = time.perf_counter()
            store.move_in(ready)
            moves.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.write("tokens", shard, table)
            puts.append(time.perf_counter() - t0)
        size = store.fs.get_file_info(store.path("tokens", shard, table.column("model_weights")[0].as_py())).size
    print(
        f"S3 (moto on loopback), one tokens file of {rows:,} rows ({size / 1e6:.1f} MB): commit by server-side "
        f"copy {statistics.median(moves) * 1e3:.1f} ms; written by the driver {statistics.median(puts) * 1e3:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--prompts", type=int, default=4000, help="prompts per model")
    parser.add_argument("--shard-size", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per prompt")
    parser.add_argument("--s3", action="store_true", help="also time a shard's commit on a moto S3 server")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["FLEET_ALLOW_TEST_DOUBLE"] = "1"  # its manifests run the labelled test double
    import ray

    tmp = Path(tempfile.mkdtemp(prefix="fleet-direct-"))
    os.environ["FLEET_CACHE"] = str(tmp / "cache")
    ray.init(address="local", num_cpus=max(args.actors), include_dashboard=False, log_to_driver=False)
    print(
        f"test-double reference per model, {args.prompts} prompts x {args.tokens} tokens per model, shard_size "
        f"{args.shard_size}, {os.cpu_count()} cores; command: {' '.join(sys.argv)}"
    )
    one: dict[str, float] = {}
    for n in args.actors:
        for write in ("driver", "actors"):
            path = manifest(
                tmp, actors=n, prompts=args.prompts, shard_size=args.shard_size, tokens=args.tokens, write=write
            )
            rows, rate, cpu = timed_run(path, tmp / "r")
            one.setdefault(write, rate / n)
            print(
                f"{n} actor(s), written by the {write:<6}: {rows:>10,} token rows, {rate:>10,.0f} rows/s "
                f"(x{rate / (n * one[write]):.2f} of {n} x one actor's), "
                f"driver CPU {cpu / rows * 1e6:5.2f} s per M rows",
                flush=True,
            )
    ray.shutdown()
    if args.s3:
        s3_commit(tmp, rows=args.shard_size * args.tokens)


if __name__ == "__main__":
    main()
