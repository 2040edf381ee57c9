"""Arrival schedules of the perf scenarios' open loop: when each request of a level is due.

Every pattern is vLLM 0.32's serving benchmark's (vllm/benchmarks/serve.py `get_request` and
`_get_current_request_rate`), checked line by line against that source:

* random (Poisson or gamma): request i waits a gap drawn from a gamma of shape `burstiness` and
  scale 1 / (rate * burstiness) after request i-1 (the first after the start), mean 1 / rate; at
  burstiness 1 the exponential gap of a Poisson process. The summed gaps are then scaled so the
  last request is due at n / rate, so every seed offers the same mean rate;
* constant: every gap is 1 / rate (vLLM's `--burstiness inf`), the last due at n / rate;
* ramp (`--ramp-up-strategy linear|exponential --ramp-up-start-rps S --ramp-up-end-rps E`): request
  i's rate is r_i = S + (E - S) p (linear) or S (E / S)^p (exponential), p = i / max(n - 1, 1); its
  gap is drawn as above at r_i (constant: 1 / r_i), and the schedule is not rescaled (vLLM rescales
  only without a ramp).

One difference, on purpose: the draws come from Python's `random.Random(seed)`, not NumPy's global
generator, so a scenario's seed fixes its schedule whatever else runs in the process.

`split` deals one schedule to several client processes (actors/load_clients.py): client j takes
arrivals j, j + k, j + 2k, ..., so the clients' arrivals merged are the one-process schedule.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from fleet.contracts.scenario import Scenario

T = TypeVar("T")


def gap(rng: random.Random, rate: float, burstiness: float) -> float:
    """The time to the next arrival at `rate`: gamma of shape `burstiness`, scale 1 / (rate * burstiness);
    at 1 the exponential gap, drawn with expovariate so a seed keeps the Poisson schedule it gave before."""
    return rng.expovariate(rate) if burstiness == 1 else rng.gammavariate(burstiness, 1 / (rate * burstiness))


def ramp_rate(strategy: str, start: float, end: float, index: int, n: int) -> float:
    """Request `index`'s rate of `n` on a ramp from `start` to `end` req/s (vLLM's `_get_current_request_rate`)."""
    progress = index / max(n - 1, 1)
    if strategy == "linear":
        return start + (end - start) * progress
    if strategy == "exponential":
        return float(start * (end / start) ** progress)
    msg = f"unknown ramp strategy {strategy!r} (expected linear or exponential)"
    raise ValueError(msg)


def schedule(
    n: int,
    *,
    rate: float | None = None,
    burstiness: float = 1.0,
    constant: bool = False,
    ramp: tuple[str, float, float] | None = None,
    seed: int = 0,
) -> list[float]:
    """Seconds from a level's start at which each of `n` requests is due, at a fixed `rate` or on a
    `ramp` (strategy, start req/s, end req/s); `constant` spaces them evenly, else gaps are random."""
    if (rate is None) == (ramp is None):
        raise ValueError("give exactly one of rate and ramp")
    rng, total, out = random.Random(seed), 0.0, []
    for i in range(n):
        r = ramp_rate(*ramp, i, n) if ramp is not None else rate
        assert r is not None and r > 0, f"request {i}: non-positive rate {r}"
        total += 1 / r if constant else gap(rng, r, burstiness)
        out.append(total)
    if ramp is None and total > 0:
        assert rate is not None
        scale = (n / rate) / total
        out = [t * scale for t in out]
    return out


def scenario_schedule(scenario: Scenario, n: int, *, rate: float | None = None) -> list[float] | None:
    """The due times of a scenario's `n` measured requests at `rate` (default its request_rate, or
    its ramp); None for a closed loop (no rate, no ramp)."""
    ramp = scenario.ramp
    rate = scenario.request_rate if rate is None else rate
    constant = scenario.arrival == "constant"
    if rate is not None:
        return schedule(n, rate=rate, burstiness=scenario.burstiness, constant=constant, seed=scenario.seed)
    if ramp is not None:
        spec = (ramp.strategy, ramp.start_rps, ramp.end_rps)
        return schedule(n, ramp=spec, burstiness=scenario.burstiness, constant=constant, seed=scenario.seed)
    return None


def split(items: list[T], clients: int) -> list[list[T]]:
    """Deal `items` to `clients`: client j gets items j, j + clients, ... (round robin, order kept)."""
    return [items[j::clients] for j in range(clients)]


def split_level(level: int, clients: int) -> list[int]:
    """The in-flight cap of each of `clients` sharing `level`: as even as can be, summing to `level`."""
    return [level // clients + (j < level % clients) for j in range(clients)]
