"""Gates against several baseline runs (fleet/analysis/perf_resample.py, `runs_ratios`): how often a
healthy run fails, how often a real drop does, and what the two-level interval costs.

1. On figures alone: a host whose whole runs differ by `--spread` (the standard deviation of a
   run's figure over the mean; a run's request noise adds `--request-noise` to its resamples), k
   baseline runs and one measured run drawn from it, the measured one lowered by each drop; the
   share of --trials trials whose gate `>= ratio` fails (upper end of the 95 % interval < ratio).
2. Time: one level of --requests requests x --tokens tokens per run, drawn once per run
   (level_draws), then output_tok_s and itl_p99_s on every resample, and runs_ratios, for k runs.
   Each the best of --rounds.

    .venv/bin/python benchmarks/baseline_runs.py [--trials 1000] [--ratio 0.97] [--spread 0.01 0.06]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.analysis import perf_resample  # noqa: E402

RUNS = (1, 2, 3, 5, 10)
DROPS = (1.0, 0.95, 0.9, 0.8)


def fail_share(k: int, drop: float, *, spread: float, noise: float, ratio: float, trials: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    failed = 0
    for _ in range(trials):
        observed = 1 + spread * rng.standard_normal(k)
        baselines = [o * (1 + noise * rng.standard_normal(perf_resample.RESAMPLES)) for o in observed]
        measured = drop * (1 + spread * rng.standard_normal())
        resampled = measured * (1 + noise * rng.standard_normal(perf_resample.RESAMPLES))
        ratios = perf_resample.runs_ratios(resampled, baselines, list(observed), seed=int(rng.integers(2**31)))
        failed += perf_resample.bounds(ratios)[1] < ratio
    return failed / trials


def level(requests: int, tokens: int, rng: np.random.Generator) -> perf_resample.Level:
    itl = 0.02 * (1 + 0.1 * rng.standard_normal((requests, tokens - 1)))
    ttft = 0.1 * (1 + 0.1 * rng.standard_normal(requests))
    e2e = ttft + itl.sum(axis=1)
    return perf_resample.Level(
        done=np.ones(requests, dtype=bool),
        n_out=np.full(requests, float(tokens)),
        n_prompt=np.full(requests, 64.0),
        latency={"ttft": ttft, "tpot": itl.mean(axis=1), "e2e": e2e},
        itl=itl.ravel(),
        itl_request=np.repeat(np.arange(requests), tokens - 1),
        wall_s=float(e2e.sum() / 8),
    )


def best(rounds: int, work: object) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        work()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--ratio", type=float, default=0.97)
    parser.add_argument("--spread", type=float, nargs="+", default=[0.01, 0.06])
    parser.add_argument("--request-noise", type=float, default=0.004)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; gate >= {args.ratio:g}, {args.trials} trials per cell")
    for spread in args.spread:
        print(f"\nrun-to-run spread {spread:.0%}, request noise {args.request_noise:.1%}: share of runs that fail")
        print("| baseline runs | " + " | ".join("healthy" if d == 1 else f"{1 - d:.0%} drop" for d in DROPS) + " |")
        print("|---" * (len(DROPS) + 1) + "|")
        for k in RUNS:
            shares = [
                fail_share(k, d, spread=spread, noise=args.request_noise, ratio=args.ratio, trials=args.trials, seed=k)
                for d in DROPS
            ]
            print(f"| {k} | " + " | ".join(f"{s:.1%}" for s in shares) + " |")
    rng = np.random.default_rng(0)
    print(f"\ntime, {args.requests} requests x {args.tokens} tokens a run (best of {args.rounds}):")
    for k in (1, 3, 5):
        runs = [level(args.requests, args.tokens, rng) for _ in range(k + 1)]

        def judge(runs: list[perf_resample.Level] = runs) -> None:
            drawn = [perf_resample.level_draws(r, seed=i) for i, r in enumerate(runs)]  # once a run, as RunBaselines
            for column in ("output_tok_s", "itl_p99_s"):
                figures = [r.figure(column, d) for r, d in zip(runs, drawn, strict=True)]
                observed = [float(f.mean()) for f in figures[1:]]
                perf_resample.bounds(perf_resample.runs_ratios(figures[0], figures[1:], observed))

        print(f"  {k} baseline runs: {best(args.rounds, judge):.2f} s for two figures")


if __name__ == "__main__":
    main()
