"""Arrival patterns (constant, Poisson, gamma, ramps) and the rate sweep, on seeded schedules and stub
streams (no engine): the schedules' statistics, vLLM's ramp formula, and the sweep's bisection."""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import AsyncGenerator
from typing import Any

import polars as pl
import pytest
from pydantic import ValidationError

from actors import arrivals
from actors import loadgen as perf
from fleet.analysis import perf as fleet_perf
from fleet.contracts.engine import Chunk, PerfResult
from fleet.contracts.scenario import Scenario


def scenario(**kw: Any) -> Scenario:
    base = {"name": "s", "concurrency": [64], "input_tokens": 4, "output_tokens": 2, "num_requests": 1}
    return Scenario(**(base | {"warmup_requests": 0} | kw))


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times], times, strict=False)]


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs)


@pytest.mark.parametrize(("burstiness", "expected_cv"), [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_random_arrivals_have_the_rate_and_burstiness_asked(burstiness: float, expected_cv: float) -> None:
    """Gamma gaps of shape b: mean 1 / rate, coefficient of variation 1 / sqrt(b) (1: Poisson); the
    schedule is rescaled so the last request is due at exactly n / rate, as vLLM's."""
    n, rate = 20_000, 50.0
    times = arrivals.schedule(n, rate=rate, burstiness=burstiness, seed=11)
    assert times[-1] == pytest.approx(n / rate, rel=1e-12)
    assert statistics.fmean(gaps(times)) == pytest.approx(1 / rate, rel=1e-9)
    assert cv(gaps(times)) == pytest.approx(expected_cv, rel=0.05)
    # Poisson: the counts per second are Poisson too (variance = mean).
    if burstiness == 1.0:
        counts = [0] * int(n / rate)
        for t in times:
            counts[min(int(t), len(counts) - 1)] += 1
        assert statistics.pvariance(counts) / statistics.fmean(counts) == pytest.approx(1.0, rel=0.15)
    assert arrivals.schedule(n, rate=rate, burstiness=burstiness, seed=11) == times  # seeded
    assert arrivals.schedule(n, rate=rate, burstiness=burstiness, seed=12) != times


def test_constant_arrivals_are_evenly_spaced() -> None:
    times = arrivals.schedule(10, rate=4.0, constant=True)
    assert times == pytest.approx([(i + 1) / 4.0 for i in range(10)])


@pytest.mark.parametrize("strategy", ["linear", "exponential"])
def test_ramps_follow_vllms_rate_formula(strategy: str) -> None:
    """Request i's rate r_i = S + (E - S) p or S (E / S)^p, p = i / (n - 1) (vLLM's
    _get_current_request_rate); constant gaps are 1 / r_i exactly, random ones average 1 / r over a
    window, and a ramp is not rescaled."""
    n, start, end = 4000, 5.0, 80.0

    def rate(i: int) -> float:
        p = i / (n - 1)
        return start + (end - start) * p if strategy == "linear" else start * (end / start) ** p

    even = arrivals.schedule(n, ramp=(strategy, start, end), constant=True)
    assert gaps(even) == pytest.approx([1 / rate(i) for i in range(n)], rel=1e-9)
    drawn = arrivals.schedule(n, ramp=(strategy, start, end), seed=3)
    for lo in range(0, n, 500):  # observed rate per window of 500 requests vs the ramp's there
        window = gaps(drawn)[lo : lo + 500]
        expected = statistics.fmean(1 / rate(i) for i in range(lo, lo + 500))
        assert statistics.fmean(window) == pytest.approx(expected, rel=0.12)
    assert gaps(drawn)[0] > 0 and drawn[-1] == pytest.approx(sum(gaps(drawn)))
    assert drawn[-1] != pytest.approx(n / end)  # no rescaling towards any single rate


def test_split_deals_one_schedule_so_the_clients_merge_back_to_it() -> None:
    times = arrivals.schedule(101, rate=20.0, seed=5)
    parts = arrivals.split(list(enumerate(times)), 3)
    assert [len(p) for p in parts] == [34, 34, 33]
    assert sorted(x for p in parts for x in p) == list(enumerate(times))
    assert arrivals.split_level(8, 3) == [3, 3, 2] and arrivals.split_level(2, 2) == [1, 1]


def test_scenario_patterns_are_checked() -> None:
    ramp = {"strategy": "linear", "start_rps": 1, "end_rps": 4}
    slo = {"ttft_s": 1.0}
    scenario(ramp=ramp, arrival="constant")
    with pytest.raises(ValidationError, match="request_rate or ramp, not both"):
        scenario(ramp=ramp, request_rate=2.0)
    with pytest.raises(ValidationError, match=r"end_rps .* at least start_rps"):
        scenario(ramp=ramp | {"start_rps": 8})
    with pytest.raises(ValidationError, match="a sweep needs an slo"):
        scenario(sweep={"floor_rps": 1})
    with pytest.raises(ValidationError, match="a sweep needs an slo"):
        scenario(sweep={"floor_rps": 1}, slo=slo, request_rate=3.0)
    with pytest.raises(ValidationError, match=r"clients \(3\) must not exceed .* \(2\)"):
        scenario(concurrency=[2, 8], clients=3)


def measure(stream: Any, sc: Scenario, level: int, n: int) -> PerfResult:
    prompts = [[0, 1, 2]] * n
    coro = perf.measure_level(stream, sc, level, prompts=prompts, warmup=[], model="m", model_weights="w", target="t")
    return asyncio.run(coro)


async def instant(ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
    yield Chunk(max_tokens)


@pytest.mark.parametrize(
    "pattern",
    [{"request_rate": 500.0, "arrival": "constant"}, {"ramp": {"strategy": "exponential", "start_rps": 100,
                                                               "end_rps": 800}}],
)  # fmt: skip
def test_a_level_is_sent_on_the_patterns_schedule(pattern: dict[str, Any]) -> None:
    sc = scenario(seed=9, **pattern)
    result = measure(instant, sc, 64, 12)
    rows = result.requests.to_pylist()
    assert [r["scheduled_s"] for r in rows] == pytest.approx(arrivals.scenario_schedule(sc, 12))
    assert all(r["sent_s"] >= r["scheduled_s"] and r["send_lag_s"] >= 0 for r in rows)
    [level] = result.level.to_pylist()
    assert (level["probe"], level["clients"], level["request_rate"]) == (0, 1, sc.request_rate)
    assert level["client_cpu_s"] >= 0


class LoadedServer:
    """A stub whose latency grows with load, as a batching engine's: each request takes 10 ms x (1 +
    the requests in flight when it starts). Open loop at r req/s settles at 10 / (1 - r / 100) ms:
    an E2E SLO of 40 ms holds up to about 75 req/s; a closed loop of 8 takes ~90 ms a request."""

    def __init__(self) -> None:
        self.in_flight = 0

    async def stream(self, ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
        self.in_flight += 1
        try:
            await asyncio.sleep(0.010 * self.in_flight)
            yield Chunk(max_tokens)
        finally:
            self.in_flight -= 1


def test_sweep_bisects_to_the_highest_rate_meeting_the_slo() -> None:
    sweep = {"floor_rps": 20.0, "min_share": 0.8, "steps": 3}
    sc = scenario(concurrency=[8], num_requests=16, arrival="constant", slo={"e2e_s": 0.040}, sweep=sweep)
    result = measure(LoadedServer().stream, sc, 8, 16 * sc.sweep.runs)  # type: ignore[union-attr]
    requests, levels = pl.from_arrow(result.requests), pl.from_arrow(result.level)
    runs = fleet_perf.summary(requests, levels, {"s": {"e2e_s": 0.040}})  # type: ignore[arg-type]
    assert runs["probe"].to_list() == list(range(5)) and runs["n_requests"].to_list() == [16] * 5
    # Probe 0, the closed loop: ~90 ms per request, fails; its rate is the ceiling. Probe 1, the floor: passes.
    closed, floor, *bisection = runs.iter_rows(named=True)
    assert closed["request_rate"] is None and closed["slo_share"] < 0.8
    assert floor["request_rate"] == 20.0 and floor["slo_share"] >= 0.8
    # Each later probe is the midpoint of the highest passing rate and the lowest failing one so far,
    # judged from the stored rows by the analysis' own rule.
    passing, failing = 20.0, closed["qps"]
    for probe in bisection:
        assert probe["request_rate"] == pytest.approx((passing + failing) / 2)
        if probe["slo_share"] >= 0.8:
            passing = probe["request_rate"]
        else:
            failing = probe["request_rate"]
    curve = fleet_perf.sweep_curve(runs, {"s": 0.8})
    assert curve["best_rps"].unique().to_list() == [passing]
    assert curve["offered_rps"].to_list() == sorted(curve["offered_rps"].to_list())
    assert curve.filter(pl.col("probe") == 0)["offered_rps"].item() == pytest.approx(closed["qps"])
    # Every probe sent fresh prompts: its rows are the sweep's num_requests, numbered from 0.
    assert requests.group_by("probe").agg(pl.col("request_index").max())["request_index"].to_list() == [15] * 5
    assert not math.isnan(passing)


def test_a_sweep_stops_at_a_closed_loop_that_meets_the_slo() -> None:
    sc = scenario(concurrency=[2], num_requests=6, slo={"e2e_s": 5.0}, sweep={"floor_rps": 1.0})
    result = measure(instant, sc, 2, 6 * sc.sweep.runs)  # type: ignore[union-attr]
    assert result.level["probe"].to_pylist() == [0]  # the most it serves meets the SLO: nothing to search
