"""The driver's steps for one shard on the driver path, before and after a change, side by side in
one process: the code of an earlier commit (`--before`, loaded from git) against this checkout's,
on the same test-double shard (no model runs: these figures are the harness's own).

Steps, as fleet/run/writer.py takes them for a scored candidate shard: prompt_stats computed from
the token rows, then requests, tokens, prompt_stats and the shards row each encoded and written
(atomic, fsynced). Each step's before and after alternate over the rounds (fleet's benchmarks'
rule, benchmarks/_common.py); printed: CPU seconds per million token rows of the best round, the
ratio after / before, file sizes, and the rate one core would take for the whole shard. The two
sides' prompt_stats are compared equal, and every file written is read back equal to its
counterpart, so a gain that changed a stored value shows as a failure, not a figure.

    .venv/bin/python benchmarks/driver_steps.py [--before 2003d58] [--prompts 2000] [--tokens 16] [--rounds 9]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from collections.abc import Callable

# The driver path as the first pass on issue 23.2 left it (docs/measurements.md).
BEFORE = "2003d58"
# Modules of the driver's steps, loaded from --before; later ones import earlier ones by these names.
MODULES = ("fleet/results/topk_arrays.py", "fleet/results/prompt_rows.py", "fleet/results/store.py")


def load_before(rev: str) -> dict[str, types.ModuleType]:
    """The step modules as of `rev`, each wired to the others of `rev` (not to this checkout's)."""
    loaded: dict[str, types.ModuleType] = {}
    for path in MODULES:
        source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True)
        name = Path(path).stem
        module = types.ModuleType(f"before_{name}")
        module.__file__ = f"{rev}:{path}"
        exec(compile(source.stdout, module.__file__, "exec"), module.__dict__)  # our own history, from git
        for other, earlier in loaded.items():  # e.g. prompt_rows' `topk_arrays` is the old one too
            if other in module.__dict__:
                module.__dict__[other] = earlier
        loaded[name] = module
    return loaded


def shard(tmp: Path, *, prompts: int, tokens: int) -> tuple[Any, Any, Any]:
    """(Generation, the reference's scores, scored token rows) of a test-double candidate shard, top-5,
    scored by a test-double reference (benchmarks/prompt_scale.py times the same shard's steps)."""
    from actors.test_double import TestDoubleEngine
    from fleet.contracts.backend_args import TestDoubleArgs
    from fleet.contracts.engine import ResolvedModel
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.sources import SyntheticSource
    from fleet.contracts.spec import ModelSpec, Sampling, Shard
    from fleet.results.scores import join_scores

    model = ResolvedModel(ModelSpec(name="m", source=SyntheticSource()), tmp, "w" * 16, None)
    sampling = Sampling(max_tokens=tokens, logprobs=5)
    cand = TestDoubleEngine(TestDoubleArgs(name="cand", logprob_shift=0.01), model, sampling=sampling)
    ref = TestDoubleEngine(TestDoubleArgs(name="ref"), model, sampling=sampling)
    work = Shard("m", "cand", "p", 0, tuple(Prompt(id=str(i), prompt=f"question {i}") for i in range(prompts)))
    gen = cand.generate(work)
    scores = ref.score(gen.requests, k=5)
    return gen, scores, join_scores(gen.tokens, scores)


def cpu(step: Callable[[], object]) -> float:
    t0 = time.process_time()
    step()
    return time.process_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=BEFORE, help="the commit to compare against")
    parser.add_argument("--prompts", type=int, default=2000, help="prompts per shard (run.shard_size)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated per prompt")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    os.environ["FLEET_ALLOW_TEST_DOUBLE"] = "1"  # the labelled test double makes the rows
    import pyarrow.parquet as pq

    from fleet.results import prompt_rows
    from fleet.results.store import RunStore
    from fleet.run.writer import keep_freed_memory

    old = load_before(args.before)
    tmp = Path(tempfile.mkdtemp(prefix="fleet-steps-"))
    gen, _, scored = shard(tmp, prompts=args.prompts, tokens=args.tokens)
    rows = scored.num_rows
    stats = {"before": old["prompt_rows"].summarize(scored), "after": prompt_rows.summarize(scored)}
    assert stats["before"].equals(stats["after"]), "prompt_stats differ between before and after"
    stores = {
        "before": old["store"].RunStore.create(tmp / "before", {"run_id": "steps"}),
        "after": RunStore.create(tmp / "after", {"run_id": "steps"}),
    }
    summarize = {"before": old["prompt_rows"].summarize, "after": prompt_rows.summarize}
    shard_id = "m/cand/p/00000"

    def writes(side: str) -> dict[str, Callable[[], object]]:
        store = stores[side]
        return {
            "write requests": lambda: store.write("requests", shard_id, gen.requests),
            "write tokens": lambda: store.write("tokens", shard_id, scored),
            "write prompt_stats": lambda: store.write("prompt_stats", shard_id, stats[side]),
            "write the shards row": lambda: store.write("shards", shard_id, gen.shard),
        }

    steps: dict[str, dict[str, Callable[[], object]]] = {
        "prompt_stats of a candidate shard": {side: lambda f=f: f(scored) for side, f in summarize.items()},
        "prompt_stats of a reference shard": {side: lambda f=f: f(gen.tokens) for side, f in summarize.items()},
    }
    before, after = writes("before"), writes("after")
    steps |= {name: {"before": before[name], "after": after[name]} for name in before}

    def measure(sides: tuple[str, ...]) -> dict[str, dict[str, float]]:
        best = {name: dict.fromkeys(sides, math.inf) for name in steps}
        for r in range(args.rounds):
            for name, step in steps.items():
                for side in sides if r % 2 == 0 else sides[::-1]:
                    best[name][side] = min(best[name][side], cpu(step[side]))
        return best

    # On a thread, as the writer runs them (glibc gives a thread its own arena to allocate from).
    with ThreadPoolExecutor(1) as thread:
        best = thread.submit(measure, ("before", "after")).result()
        # Then with the writer's allocator setting, which lasts for the rest of the process.
        kept = keep_freed_memory()
        for name, sides in thread.submit(measure, ("before", "after")).result().items():
            best[name] |= {"before, memory kept": sides["before"], "after, memory kept": sides["after"]}

    print(
        f"the driver's steps for one shard ({args.prompts} prompts x {args.tokens} tokens, {rows:,} token rows, "
        f"test double, top-5), CPU s per M token rows, best of {args.rounds} alternated rounds; "
        f"before: {args.before}, after: this checkout; load average "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores"
    )
    sides = list(best[next(iter(best))])
    print(f"  glibc's malloc keeping freed memory (fleet/run/writer.py keep_freed_memory): {kept}")
    print(f"  {'step':<36} " + " ".join(f"{side:>20}" for side in sides))
    total = dict.fromkeys(sides, 0.0)
    for name, measured in best.items():
        per_m = {side: t / rows * 1e6 for side, t in measured.items()}
        if name != "prompt_stats of a reference shard":  # the candidate shard's own steps add up
            total = {side: total[side] + per_m[side] for side in total}
        print(f"  {name:<36} " + " ".join(f"{per_m[side]:20.3f}" for side in sides))
    print(f"  {'a candidate shard in all':<36} " + " ".join(f"{total[side]:20.3f}" for side in sides))
    print("  one core, token rows/s: " + ", ".join(f"{1e6 / total[side]:,.0f} {side}" for side in sides))
    for side in sides[1:]:
        print(f"  {side} / before: {total[side] / total['before']:.2f} of the CPU")
    print("  files (bytes), read back equal on both sides:")
    for table in ("requests", "tokens", "prompt_stats", "shards"):
        weights = gen.shard.column("model_weights")[0].as_py()
        paths = {side: stores[side].path(table, shard_id, weights) for side in ("before", "after")}
        read = {side: pq.read_table(path) for side, path in paths.items()}
        assert read["before"].equals(read["after"]), f"{table}: the files read back differently"
        size = {side: Path(path).stat().st_size for side, path in paths.items()}
        print(f"    {table:<14} {size['before']:>9,} {size['after']:>9,} ({size['after'] / size['before']:.3f}x)")


if __name__ == "__main__":
    main()
