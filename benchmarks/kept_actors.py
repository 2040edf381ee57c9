"""What kept actors save: one `fleet run` of an HF float32 reference and N vLLM CPU candidates that
take turns on a 2-slot Ray (the reference and one candidate at a time, as on a 2-core laptop), with
`run.keep_actors` on and off, alternated (on off off on ...) so that drift on the machine falls on both.

    .venv/bin/python benchmarks/kept_actors.py [--candidates 4] [--rounds 2]

Printed per round and variant: the run's wall time (driver.run, Ray already up) and how many actor
processes its targets ran in (run.json's provenance pids); then each variant's best and median, and
the saving per candidate that reused a process. The model is the test suite's tiny llama: what is
measured is the start of a target, not its engine's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import _common

MANIFEST = """
models:
  - name: tiny
    source: {{kind: synthetic, family: llama, seed: 7, hidden_size: 128, intermediate_size: 256, num_layers: 2,
             num_heads: 4, num_kv_heads: 2, init_std: 0.1}}
prompts:
  p: [{{id: a, prompt: "The capital of France is"}}, {{id: b, prompt: "Quantum computing is"}}]
targets:
  - {{name: hf, kind: hf, dtype: float32}}
{candidates}
reference: hf
sampling: {{max_tokens: 8, logprobs: 3}}
run: {{keep_actors: {keep}}}
"""


def one_run(base: Path, n: int, *, keep: bool, tag: str) -> tuple[float, int]:
    """Wall seconds of one run, and how many distinct actor processes its targets ran in."""
    from fleet.run import driver

    lines = "\n".join(f"  - {{name: v{i}, kind: vllm, dtype: float32, max_model_len: 256}}" for i in range(n))
    path = base / f"{tag}.yaml"
    path.write_text(MANIFEST.format(candidates=lines, keep=str(keep).lower()))
    t0 = time.perf_counter()
    run_dir, outcome = driver.run(path, results_dir=base / "results", run_id=tag, progress=False)
    wall = time.perf_counter() - t0
    assert not outcome.failures, outcome.failures
    pids = {p["pid"] for p in json.loads((Path(run_dir) / "run.json").read_text())["provenance"].values()}
    return wall, len(pids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    _common.setup_env()
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    walls: dict[str, list[float]] = {"keep_actors: true": [], "keep_actors: false": []}
    with tempfile.TemporaryDirectory() as tmp:
        one_run(Path(tmp), 1, keep=True, tag="warm")  # the model built and the OS caches warm, for both
        for r in range(opts.rounds):
            for keep in (True, False) if r % 2 == 0 else (False, True):
                name = f"keep_actors: {str(keep).lower()}"
                wall, processes = one_run(Path(tmp), opts.candidates, keep=keep, tag=f"r{r}-{keep}")
                walls[name].append(wall)
                print(
                    f"  round {r + 1}/{opts.rounds} {name:<20} {wall:7.1f} s, {processes} actor processes", flush=True
                )
    ray.shutdown()
    print(f"\nOne run of an HF reference and {opts.candidates} vLLM CPU candidates taking turns on 2 CPU slots")
    print(f"  load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    for name, values in walls.items():
        print(f"  {name:<20} best {min(values):7.1f} s  median {statistics.median(values):7.1f} s")
    saved = min(walls["keep_actors: false"]) - min(walls["keep_actors: true"])
    print(f"  saved: {saved:.1f} s per run, {saved / (opts.candidates - 1):.1f} s per candidate that reused a process")


if __name__ == "__main__":
    main()
