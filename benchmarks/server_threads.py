"""vllm-server as fleet-eval launches it vs a default `python -m vllm.entrypoints.openai.api_server`
with the same flags: output tok/s of one perf scenario, side by side in one run.

    .venv/bin/python benchmarks/server_threads.py [--rounds 2] [--num-cpus 2] [--concurrency 1 4]

Variants, each started fresh every round (rounds alternate the order), all measured by the same
load generator (fleet's streaming OpenAI client, actors/loadgen.py) on the benchmark model:
- "fleet num_cpus=N": VllmServerEngine as its actor runs it: the CPU defaults of
  fleet/contracts/backend_args.py (in-process engine core, `nobind`) and the threads of
  actors/threads.py (OMP_NUM_THREADS = MKL_NUM_THREADS = N), which the server inherits.
- "fleet num_cpus=1": the same with one CPU slot: what every server ran with before the actor
  set its threads (Ray's OMP_NUM_THREADS=1, inherited).
- "default server": the same command line (VllmServerEngine.command) in this shell's environment
  without fleet's settings: vLLM's own defaults (engine-core child process, `auto` binding, OpenMP
  threads as vLLM picks them). Only VLLM_CPU_KVCACHE_SPACE=1 is given to it as to the others: its
  default reserves most of the host's memory, which a shared machine cannot give.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

import _common

KEY_ENV = "FLEET_BENCH_SERVER_KEY"
FLEET_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, default=16)
    opts = parser.parse_args()
    clean = {k: v for k, v in os.environ.items() if k not in FLEET_KEYS}

    from actors import threads
    from actors.endpoint import EndpointEngine
    from actors.vllm_server import VllmServerEngine, _free_port
    from fleet.contracts.backend_args import EndpointArgs, VllmServerArgs
    from fleet.contracts.scenario import Scenario
    from fleet.contracts.spec import Sampling

    resolved, _ = _common.model()
    sampling = Sampling(max_tokens=16, logprobs=5)
    scenario = Scenario(
        name="decode", concurrency=opts.concurrency, input_tokens=128, output_tokens=64,
        num_requests=opts.requests, warmup_requests=2,
    )  # fmt: skip
    base = {"name": "srv", "dtype": "bfloat16", "max_model_len": 512}

    command: dict[str, Callable[[int], list[str]]] = {}  # set by a fleet variant, which runs first

    def out_tok_s(engine: object) -> dict[int, float]:
        rates = {}
        for level in opts.concurrency:
            result = engine.perf(scenario, level)  # type: ignore[attr-defined]
            tokens = sum(result.requests.column("n_output_tokens").to_pylist())
            rates[level] = tokens / result.level.column("wall_s")[0].as_py()
        return rates

    def fleet(num_cpus: int) -> dict[int, float]:
        args = VllmServerArgs(**base, num_cpus=num_cpus)
        os.environ.clear()
        os.environ.update(clean | args.actor_env())
        settings = threads.apply(args)  # what TargetActor does before the engine starts
        print(f"  fleet num_cpus={num_cpus}: {settings.env()}", flush=True)
        engine = VllmServerEngine(args, resolved, sampling=sampling)
        command["of"] = engine.command  # the default server gets exactly this command line
        try:
            return out_tok_s(engine)
        finally:
            engine.shutdown()

    def default() -> dict[int, float]:
        key, port = secrets.token_urlsafe(16), _free_port("127.0.0.1")
        cmd = command["of"](port)
        env = clean | {"VLLM_API_KEY": key, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(_common.ROOT)}
        server = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            _wait_ready(f"http://127.0.0.1:{port}/v1/models", key)
            os.environ[KEY_ENV] = key
            client = EndpointArgs(name="default", base_url=f"http://127.0.0.1:{port}/v1", api_key_env=KEY_ENV)
            return out_tok_s(EndpointEngine(client, resolved, sampling=sampling))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)  # one SIGTERM: vLLM stops its engine core itself
            server.wait(timeout=60)

    # The default server is in the middle of every round's order, so a fleet variant ran before it.
    variants: dict[str, Callable[[], dict[int, float]]] = {
        f"fleet num_cpus={opts.num_cpus}": lambda: fleet(opts.num_cpus),
        "default server": default,
        "fleet num_cpus=1": lambda: fleet(1),
    }
    rates: dict[str, dict[int, list[float]]] = {name: {lvl: [] for lvl in opts.concurrency} for name in variants}
    for r in range(opts.rounds):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            got = variants[name]()
            for level, rate in got.items():
                rates[name][level].append(rate)
            print(f"  round {r + 1}/{opts.rounds} {name:<20} " + "  ".join(f"c={k}: {v:7.1f}" for k, v in got.items()))
    os.environ.clear()
    os.environ.update(clean)
    for level in opts.concurrency:
        _common.report(
            f"vllm-server decode (128 in, 64 out, {opts.requests} requests) at concurrency {level}, bf16",
            {name: per[level] for name, per in rates.items()},
            "output tok/s",
        )


def _wait_ready(url: str, key: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=5) as resp:
            if resp.status == 200:
                return
        time.sleep(0.5)
    msg = f"default server not ready after {timeout:g} s"
    raise RuntimeError(msg)


if __name__ == "__main__":
    sys.exit(main())
