"""What the benchmarks share: a synthetic model big enough to be compute-bound on a CPU, the
prompts, the engine environment, and side-by-side timing that alternates the variants.

Alternating (A B B A ...) in one process on one engine spreads slow drifts (other load on the
machine, thermal state, caches) over every variant instead of charging them to the one that
happened to run last. The headline figure is each variant's best round: other processes can
only slow a round down, so the fastest of many interleaved rounds is the closest to the
variant's undisturbed speed (the usual min-time rule of micro-benchmarks); medians and the
machine's load average are printed beside it so a busy machine shows.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet.contracts.engine import ResolvedModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable as `python benchmarks/x.py` from a checkout

# ~33M parameters: each decode step is real matrix work, not just Python overhead (the 2-layer
# test model would exaggerate any harness cost), yet a run takes minutes on 2 cores.
MODEL = {
    "kind": "synthetic", "family": "llama", "seed": 11, "hidden_size": 512, "intermediate_size": 1536,
    "num_layers": 6, "num_heads": 8, "num_kv_heads": 4, "vocab_size": 4096, "max_position_embeddings": 1024,
    "init_std": 0.02,
}  # fmt: skip


def setup_env() -> None:
    """The environment fleet-eval's actors run vLLM with on CPU (before vllm is imported)."""
    from fleet.contracts.backend_args import CPU_ENV

    for key, value in (CPU_ENV | {"VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"}).items():
        os.environ.setdefault(key, value)


def model(name: str = "bench") -> tuple[ResolvedModel, Path]:
    """(ResolvedModel, directory) of the benchmark model, built once into $FLEET_CACHE."""
    from actors.sources import resolver
    from fleet.contracts.engine import ResolvedModel
    from fleet.contracts.spec import ModelSpec

    spec = ModelSpec.model_validate({"name": name, "source": MODEL})
    path = resolver(spec.source).local_dir()
    return ResolvedModel(spec, path, "bench", None), path


def prompts(n: int) -> list[str]:
    """`n` distinct prompts: the first words of the corpus's sentences, cycled with a suffix."""
    sentences = [s.strip() for s in (ROOT / "actors" / "data" / "corpus.txt").read_text().split(".") if s.strip()]
    return [" ".join(sentences[i % len(sentences)].split()[:12]) + f" ({i})" for i in range(n)]


def alternate(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run each variant once per round, order reversed every other round; each returns a rate."""
    names = list(variants)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(variants[name]())
            print(f"  round {r + 1}/{rounds} {name:<32} {out[name][-1]:10.1f}", flush=True)
    return out


def report(title: str, rates: dict[str, list[float]], unit: str) -> dict[str, float]:
    """Print best and median per variant and the load average; return the best rates."""
    print(f"\n{title}\n  command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"  clock: {'process CPU time' if clock is time.process_time else 'wall time'}")
    print(f"  load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    for name, values in rates.items():
        print(f"  {name:<34} best {max(values):9.1f}  median {statistics.median(values):9.1f} {unit}")
    return {name: max(values) for name, values in rates.items()}


def ratio(rates: dict[str, list[float]], a: str, b: str) -> float:
    """a / b of the best rounds; also prints the median of per-round (paired) ratios."""
    best = max(rates[a]) / max(rates[b])
    pairs = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
    print(f"  {a} / {b}: {best:.3f} best rounds; {statistics.median(pairs):.3f} median of paired rounds")
    return best


# Wall time by default. `--clock cpu` counts this process's CPU seconds instead (all its threads;
# the vLLM benchmarks run the engine in-process, VLLM_ENABLE_V1_MULTIPROCESSING=0): a variant is
# not charged for the time other processes held the cores, so a ratio holds on a shared machine.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def timed(fn: Callable[[], int]) -> float:
    """Units per second of `fn`, which returns how many units (tokens) it produced."""
    t0 = clock()
    units = fn()
    return units / (clock() - t0)


@dataclass(frozen=True)
class VllmBench:
    """The setup the vLLM benchmarks share: options, model, prompts as a shard, one engine."""

    opts: argparse.Namespace
    model: ResolvedModel
    texts: list[str]
    shard: Any
    engine: Any


def vllm_bench(description: str) -> VllmBench:
    """Parse --rounds/--prompts/--max-tokens and build a bf16 VllmEngine with top-5 logprobs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="rates per wall or CPU second")
    opts = parser.parse_args()
    global clock
    clock = CLOCKS[opts.clock]
    setup_env()

    from actors.vllm_engine import VllmEngine
    from fleet.contracts.backend_args import VllmArgs
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.spec import Sampling, Shard

    resolved, _ = model()
    texts = prompts(opts.prompts)
    shard = Shard("bench", "vllm", "bench", 0, tuple(Prompt(id=str(i), prompt=t) for i, t in enumerate(texts)))
    sampling = Sampling(max_tokens=opts.max_tokens, logprobs=5)
    engine = VllmEngine(VllmArgs(name="vllm", dtype="bfloat16", max_model_len=512), resolved, sampling=sampling)
    return VllmBench(opts, resolved, texts, shard, engine)
