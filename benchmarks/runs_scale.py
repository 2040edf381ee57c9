"""`fleet runs ROOT` and `fleet query ROOT "SQL"` over a results root of 1,000 runs (issue 23's goal:
under 2 s each), with the root's catalog and without it.

The runs are one small run replicated: 2 targets x 4 prompts x 8 tokens of made-up rows, written
through the store API as the driver writes them (RunStore.create, write per shard, the status at the
end, the gate verdict), so each run has its own run_id in its rows and its own catalog entry. No
engine runs. Printed, each the best of --rounds (other load on the machine only slows a round):
- in-process: catalog.runs and query.query, once the catalog's runs.json is written;
- as the CLI, a fresh `python -m fleet` process each time (imports included);
- the fallback with <root>/_catalog deleted before every round (every run.json read, as before the
  catalog), and the round after it (the rows read are cached again);
- with --before CHECKOUT: the CLI of another checkout (e.g. main before the catalog) on the same root.
--root s3://bucket/prefix builds the runs there instead of in a temp directory (the endpoint as for
`fleet run --results`, e.g. FLEET_S3_ENDPOINT; a moto_server on 127.0.0.1 will do), and removes them
at the end.

    .venv/bin/python benchmarks/runs_scale.py [--runs 1000] [--rounds 3] [--before CHECKOUT] [--root URI]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The cross-run query of docs/recipes.md: TF max |dlogp| per run and target over the last 30 runs.
SQL = (
    "SELECT run_id, target, MAX(ABS(logprob - ref_logprob)) AS tf_max FROM tokens "
    "WHERE ref_logprob IS NOT NULL AND run_id IN (SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 30) "
    "GROUP BY run_id, target ORDER BY run_id, target"
)
# Every run's rows: the whole stacked tokens table is read.
SQL_ALL = "SELECT COUNT(*) AS token_rows, COUNT(DISTINCT run_id) AS runs FROM tokens"


def small_run() -> list[tuple[str, str, object]]:
    """(table, shard_id, Arrow rows) of one run: a reference and a candidate, 4 prompts of 8 tokens."""
    import pyarrow as pa

    keys = {"model": "m", "model_weights": "0123456789abcdef", "prompt_set": "s"}
    out: list[tuple[str, str, object]] = []
    for target, shift in (("ref", 0.0), ("cand", 0.01)):
        shard = f"m/{target}/s/00000"
        requests, tokens = [], []
        for p in range(4):
            ids = [(p * 7 + i) % 50 for i in range(8)]
            requests.append(keys | {"target": target, "prompt_id": f"p{p}", "shard_id": shard, "n_output_tokens": 8})
            requests[-1] |= {"output_token_ids": ids, "ttft_s": 0.01 * (p + 1), "tpot_s": 0.005, "e2e_s": 0.05}
            for pos, tok in enumerate(ids):
                row = keys | {"target": target, "prompt_id": f"p{p}", "position": pos, "token_id": tok}
                row |= {"logprob": -0.5 - shift * pos, "rank": 1, "topk_ids": [tok], "topk_logprobs": [-0.5]}
                if target != "ref":
                    row |= {"ref_logprob": -0.5, "ref_rank": 1, "ref_topk_ids": [tok], "ref_topk_logprobs": [-0.5]}
                tokens.append(row)
        shard_row = keys | {"target": target, "shard_id": shard, "n_requests": 4, "n_output_tokens": 32, "wall_s": 0.2}
        out += [("requests", shard, pa.Table.from_pylist(requests)), ("tokens", shard, pa.Table.from_pylist(tokens))]
        out.append(("shards", shard, pa.Table.from_pylist([shard_row])))
    return out


def build(root: str, runs: int) -> None:
    """`runs` copies of the small run under `root`, each written as `fleet run` writes one."""
    from fleet.results import catalog
    from fleet.results.store import RunStore, join

    rows = small_run()
    manifest = {"models": [{"name": "m"}], "targets": [{"name": "ref"}, {"name": "cand"}]}
    for i in range(runs):
        run_id = f"run-{i:05d}"
        info = {"run_id": run_id, "reference": "ref", "manifest_resolved": manifest}
        store = RunStore.create(join(root, run_id), info)
        for table, shard, data in rows:
            store.write(table, shard, data)  # type: ignore[arg-type]
        store.update_info(status="complete", finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
        catalog.record_verdict(join(root, run_id), "PASS")


def best(name: str, fn: Callable[[], object], rounds: int, before: Callable[[], object] = lambda: None) -> float:
    """The fastest of `rounds` calls of `fn` (each after `before`), printed as soon as it is known."""
    times = []
    for _ in range(rounds):
        before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    print(f"  {name:<58} {min(times):7.3f} s", flush=True)
    return min(times)


def cli(checkout: Path, *argv: str) -> Callable[[], None]:
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "FLEET_S3"))}  # an S3 root's endpoint
    env |= {"PYTHONPATH": str(checkout), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def run() -> None:
        # cwd: `python -m` puts it first on sys.path, ahead of PYTHONPATH
        proc = subprocess.run(
            [sys.executable, "-m", "fleet", *argv], capture_output=True, text=True, env=env, cwd=checkout
        )
        if proc.returncode != 0:
            raise SystemExit(f"fleet {argv[0]} failed ({proc.returncode}): {proc.stderr[-1000:]}")

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout whose CLI to time on the same root")
    parser.add_argument("--root", help="a results root URI to build in (default: a temp directory)")
    args = parser.parse_args()

    from fleet.analysis import query
    from fleet.results import catalog, store

    root = args.root or str(Path(tempfile.mkdtemp(prefix="fleet-runs-scale-")) / "results")
    fs, path = store.locate(root)
    t0 = time.perf_counter()
    build(root, args.runs)
    print(f"built {args.runs} runs under {root} in {time.perf_counter() - t0:.1f} s")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}; load average {os.getloadavg()[0]:.2f}")

    t0 = time.perf_counter()
    assert catalog.runs(root).height == args.runs
    print(f"  first listing, runs.json not yet written (reads every entry): {time.perf_counter() - t0:.3f} s")
    print(f"\n{args.runs} runs, best of {args.rounds} rounds (the fallback's query and --before: one round)")
    figures: dict[str, float] = {}

    def measure(name: str, fn: Callable[[], object], rounds: int, before: Callable[[], object] = lambda: None) -> None:
        figures[name] = best(name, fn, rounds, before)

    measure("runs, in-process", lambda: catalog.runs(root), args.rounds)
    measure("query (last 30 runs), in-process", lambda: query.query(root, SQL), args.rounds)
    measure("query (all rows), in-process", lambda: query.query(root, SQL_ALL), args.rounds)
    measure("fleet runs (CLI)", cli(ROOT, "runs", root), args.rounds)
    measure("fleet query, last 30 runs (CLI)", cli(ROOT, "query", root, SQL), args.rounds)
    measure("fleet query, all rows (CLI)", cli(ROOT, "query", root, SQL_ALL), args.rounds)
    assert query.query(root, SQL_ALL).row(0) == (args.runs * 2 * 4 * 8, args.runs)  # 2 targets, 4 x 8 tokens

    def drop() -> None:
        with contextlib.suppress(FileNotFoundError):
            fs.delete_dir(f"{path}/_catalog")

    measure("runs, no catalog, in-process", lambda: catalog.runs(root), args.rounds, before=drop)
    measure("fleet runs, no catalog (CLI)", cli(ROOT, "runs", root), args.rounds, before=drop)
    measure("fleet query, last 30 runs, no catalog (CLI)", cli(ROOT, "query", root, SQL), 1, before=drop)
    measure("fleet runs, after the fallback (CLI)", cli(ROOT, "runs", root), args.rounds)
    if args.before:
        measure(f"fleet runs, {args.before} (CLI)", cli(args.before, "runs", root), 1)
        measure(f"fleet query, last 30 runs, {args.before} (CLI)", cli(args.before, "query", root, SQL), 1)
    print(json.dumps({"runs": args.runs, **{k: round(v, 4) for k, v in figures.items()}}))
    fs.delete_dir(path)
    if not args.root:
        shutil.rmtree(Path(path).parent)


if __name__ == "__main__":
    main()
