"""How many threads an actor's engine runs with: as many as the CPU slots it holds.

Ray starts an actor with OMP_NUM_THREADS set to its num_cpus (1 by default) and every child
process inherits it, so a CPU engine would silently run on one core whatever the manifest
reserved. The actor sets the thread counts itself, from `num_cpus`, before any engine import:
OMP_NUM_THREADS and MKL_NUM_THREADS (read by torch and the vllm-server subprocess at start),
torch's intra-op threads, and on cpu vLLM's per-rank OpenMP binding. A one-rank engine is not
bound (`nobind`: two engines on one host would both pin to core 0); a tensor-parallel engine gets
one core set per rank, "0|1" for two ranks on two cores, taken from the cores the process may
run on. Values the manifest sets in a target's `env` win. What was set is recorded in run.json.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import MutableMapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleet.contracts.targets import TargetArgs

BIND = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class Threads:
    """The thread settings of one actor (and of the engine processes it starts)."""

    threads: int  # the CPU slots the actor holds, as whole cores
    per_rank: int  # OMP / MKL / torch threads of each engine process (the actor's own included)
    cpu_bind: str | None  # VLLM_CPU_OMP_THREADS_BIND on cpu, else None

    def env(self) -> dict[str, str]:
        # MKL_NUM_THREADS too, at the per-rank count: torch takes it over OMP_NUM_THREADS, which is
        # all vLLM sets for each rank it binds (measured: ranks ran 2 threads each on "0|1" otherwise).
        out = {"OMP_NUM_THREADS": str(self.per_rank), "MKL_NUM_THREADS": str(self.per_rank)}
        return out | ({BIND: self.cpu_bind} if self.cpu_bind is not None else {})


def plan(target: TargetArgs, cores: Sequence[int]) -> Threads:
    """The settings for `target` on a process allowed to run on `cores`."""
    threads = max(1, math.floor(target.num_cpus))
    ranks = 1 if target.spans_nodes else target.cards  # over nodes, vLLM's Ray workers are elsewhere
    if target.device != "cpu":
        return Threads(threads, threads, None)
    if ranks == 1:
        return Threads(threads, threads, target.env.get(BIND, "nobind"))
    usable = sorted(cores)[:threads]
    if len(usable) < ranks:
        msg = f"target {target.name!r}: {ranks} ranks need a core each; this process may run on {sorted(cores)}"
        raise RuntimeError(msg)
    per_rank = len(usable) // ranks
    groups = [usable[i * per_rank : (i + 1) * per_rank] for i in range(ranks)]
    return Threads(threads, per_rank, target.env.get(BIND) or "|".join(_id_list(g) for g in groups))


def _id_list(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5", the form vLLM parses."""
    runs: list[list[int]] = []
    for c in cores:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def apply(target: TargetArgs, *, env: MutableMapping[str, str] = os.environ) -> Threads:
    """Set the thread environment of this process (the manifest's `env` wins) and torch's threads,
    before the engine is built."""
    settings = plan(target, sorted(os.sched_getaffinity(0)))
    for key, value in settings.env().items():
        env[key] = target.env.get(key, value)
    if target.runs_torch:
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    return settings


def describe(settings: Threads, rank_threads: list[int] | None = None) -> dict[str, object]:
    """What run.json records: the settings, and the threads torch reports in this process and in
    each engine rank (where the engine can be asked)."""
    out: dict[str, object] = asdict(settings)
    out |= {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if "torch" in sys.modules:
        out["torch_threads"] = sys.modules["torch"].get_num_threads()
    if rank_threads is not None:
        out["rank_threads"] = rank_threads
    return out
