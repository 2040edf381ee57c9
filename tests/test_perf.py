"""The load generator and the perf summary against hand-computed figures (no engine)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest
from pydantic import ValidationError

from actors import arrivals, send_loop, workloads
from actors import loadgen as perf
from fleet.analysis import perf as fleet_perf
from fleet.contracts import perf_schema
from fleet.contracts.engine import Chunk, EngineStats, PerfResult
from fleet.contracts.scenario import Scenario, Slo


class FakeTokenizer:
    """Vocabulary of 50 ids, 0-2 special, BOS 0 added to every encoding."""

    all_special_ids = (0, 1, 2)
    bos_token_id = 0

    def __len__(self) -> int:
        return 50

    def __call__(self, text: str, add_special_tokens: bool = True) -> SimpleNamespace:
        return SimpleNamespace(input_ids=[0] * add_special_tokens + [3 + ord(c) % 40 for c in text])


class Clock:
    """A scripted perf_counter: the fake stream sets `t` before each chunk it yields."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def scenario(**kw: Any) -> Scenario:
    return Scenario(
        **({"name": "s", "concurrency": [1], "input_tokens": 4, "output_tokens": 5, "num_requests": 1}) | kw
    )


def run(stream: Any, sc: Scenario, level: int, n: int = 1, warmup: int = 0) -> PerfResult:
    prompts, warm = [[0, 1, 2]] * n, [[0, 1]] * warmup
    coro = perf.measure_level(stream, sc, level, prompts=prompts, warmup=warm, model="m", model_weights="w", target="t")
    return asyncio.run(coro)


def test_scenario_takes_exactly_one_prompt_source() -> None:
    for bad in ({"prompt_set": "x"}, {"input_tokens": None}):
        with pytest.raises(ValidationError, match="exactly one of input_tokens"):
            scenario(**bad)
    with pytest.raises(ValidationError, match="concurrency levels"):
        scenario(concurrency=[4, 0])
    with pytest.raises(ValidationError, match="extra"):
        scenario(batch=3)
    assert scenario(input_tokens=None, prompt_set="x").prompt_set == "x"


def test_synthetic_prompts_have_the_exact_length_and_are_reproducible() -> None:
    tok = FakeTokenizer()
    a = workloads.synthetic_prompts(tok, n=20, length=7, seed=3)
    assert a == workloads.synthetic_prompts(tok, n=20, length=7, seed=3)
    assert a != workloads.synthetic_prompts(tok, n=20, length=7, seed=4)
    assert {len(p) for p in a} == {7}
    assert all(p[0] == 0 and not set(p[1:]) & {0, 1, 2} for p in a)  # BOS as the tokenizer adds, then no specials
    assert len({tuple(p[:3]) for p in a}) > 1  # no shared prefix for the prefix cache to hit


def test_each_level_sends_fresh_synthetic_prompts() -> None:
    """Levels 1 and 8 of one scenario share no prompt (nor warm-up): no prefix-cache hits across levels."""
    tok = FakeTokenizer()
    sc = scenario(input_tokens=6, num_requests=20, warmup_requests=4)
    one, warm_one = workloads.prompt_ids(sc, tok, level=1)
    eight, warm_eight = workloads.prompt_ids(sc, tok, level=8)
    assert one == workloads.prompt_ids(sc, tok, level=1)[0]  # still reproducible
    seen = {tuple(p[1:]) for p in one + warm_one}
    assert not seen & {tuple(p[1:]) for p in eight + warm_eight}


def test_prompt_ids_cycles_a_prompt_set_and_warms_up_on_other_prompts() -> None:
    tok = FakeTokenizer()
    sc = scenario(input_tokens=None, prompt_set="p", num_requests=5, warmup_requests=2)
    measured, warm = workloads.prompt_ids(sc, tok, ["ab", "abcd"], level=1)
    assert measured == [tok("ab").input_ids, tok("abcd").input_ids] * 2 + [tok("ab").input_ids]
    assert len(warm) == 2 and {len(w) for w in warm} == {4} and not {tuple(w) for w in warm} & {tuple(measured[0])}
    with pytest.raises(ValueError, match="pass its prompts"):
        workloads.prompt_ids(sc, tok, None, level=1)
    with pytest.raises(ValueError, match="max_model_len 6"):
        workloads.check_fits(scenario(), [[0] * 2], 6)


@pytest.mark.parametrize(
    ("script", "ttft", "itl", "tpot"),
    [
        # 1 token at +0.5, 3 tokens at +0.8 (each 0.3/3 after the previous), 1 at +1.0.
        ([(10.5, 1), (10.8, 3), (11.0, 1)], 0.5, [0.1, 0.1, 0.1, 0.2], 0.5 / 4),
        # A first chunk of 3: the two extra tokens arrive with the first (gap 0), not over the TTFT.
        ([(10.5, 3), (10.9, 2)], 0.5, [0.0, 0.0, 0.2, 0.2], 0.4 / 4),
    ],
)
def test_a_chunk_of_k_tokens_counts_as_k_tokens(
    monkeypatch: pytest.MonkeyPatch, script: list[tuple[float, int]], ttft: float, itl: list[float], tpot: float
) -> None:
    clock = Clock(10.0)
    monkeypatch.setattr(send_loop, "_now", clock)

    async def stream(ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
        for t, n in script:
            clock.t = t
            yield Chunk(n)
        yield Chunk(0, EngineStats(queue_s=0.01, ttft_s=0.4, tpot_s=0.09))

    result = run(stream, scenario(), 1)
    [row] = result.requests.to_pylist()
    assert row["ttft_s"] == pytest.approx(ttft)
    assert row["itl_s"] == pytest.approx(itl)
    assert sum(row["itl_s"]) == pytest.approx(script[-1][0] - script[0][0])
    assert row["tpot_s"] == pytest.approx(tpot)
    assert row["e2e_s"] == pytest.approx(script[-1][0] - 10.0)
    assert (row["n_output_tokens"], row["n_chunks"], row["n_prompt_tokens"]) == (5, len(script), 3)
    assert (row["engine_queue_s"], row["engine_ttft_s"], row["engine_tpot_s"]) == (0.01, 0.4, 0.09)
    assert (row["scheduled_s"], row["sent_s"], row["queue_delay_s"]) == (0.0, 0.0, 0.0)
    assert result.level.to_pylist()[0]["wall_s"] == pytest.approx(script[-1][0] - 10.0)
    assert result.requests.schema.equals(perf_schema.PERF_REQUESTS) and result.level.schema.equals(
        perf_schema.PERF_LEVELS
    )


def test_closed_loop_holds_the_level_and_does_not_record_warmup() -> None:
    in_flight, peak, calls = 0, 0, 0

    async def stream(ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
        nonlocal in_flight, peak, calls
        calls += 1
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            for _ in range(max_tokens):
                await asyncio.sleep(0.001)
                yield Chunk(1)
        finally:
            in_flight -= 1

    result = run(stream, scenario(output_tokens=3), 3, n=10, warmup=4)
    rows = result.requests.to_pylist()
    assert (peak, calls, len(rows)) == (3, 14, 10)
    assert [r["request_index"] for r in rows] == list(range(10))
    assert all(r["n_output_tokens"] == 3 and r["error"] is None for r in rows)
    # Closed loop: a request is due when a slot frees, so the first three are due at once.
    assert [r["scheduled_s"] for r in rows[:3]] == [0.0] * 3 and rows[3]["scheduled_s"] > 0
    level = result.level.to_pylist()[0]
    assert (level["level"], level["n_requests"], level["n_errors"], level["request_rate"]) == (3, 10, 0, None)


def test_open_loop_follows_seeded_poisson_arrivals_and_shows_backlog() -> None:
    async def slow(ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
        await asyncio.sleep(0.02)
        yield Chunk(max_tokens)

    sc = scenario(request_rate=1000.0, seed=7)
    rows = run(slow, sc, 1, n=6).requests.to_pylist()
    rng, due, drawn = random.Random(7), 0.0, []
    for _ in range(6):
        due += rng.expovariate(1000.0)
        drawn.append(due)
    # The seeded draws, scaled so the last is due at n / rate (vLLM's serving benchmark does the same).
    expected = [d * (6 / 1000.0) / drawn[-1] for d in drawn]
    assert [r["scheduled_s"] for r in rows] == pytest.approx(expected)
    # One slot, ~1 ms between arrivals, 20 ms per request: each waits longer than the one before.
    delays = [r["queue_delay_s"] for r in rows]
    assert delays == sorted(delays) and delays[-1] > 0.08


def test_burstiness_draws_vllms_gamma_gaps() -> None:
    """Gaps of shape b and scale 1 / (rate * b), as vLLM's --burstiness: mean 1 / rate, coefficient
    of variation 1 / sqrt(b); the run's schedule is exactly the seeded draws."""
    rng = random.Random(3)
    gaps = [arrivals.gap(rng, 50.0, 0.25) for _ in range(20_000)]
    mean = sum(gaps) / len(gaps)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert mean == pytest.approx(1 / 50.0, rel=0.05) and cv == pytest.approx(2.0, rel=0.05)

    async def fast(ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
        yield Chunk(max_tokens)

    rows = run(fast, scenario(request_rate=1000.0, seed=7, burstiness=4.0), 2, n=5).requests.to_pylist()
    rng, due, drawn = random.Random(7), 0.0, []
    for _ in range(5):
        due += rng.gammavariate(4.0, 1 / (1000.0 * 4.0))
        drawn.append(due)
    assert [r["scheduled_s"] for r in rows] == pytest.approx([d * (5 / 1000.0) / drawn[-1] for d in drawn])


def test_failed_requests_are_rows_and_failed_warmup_stops_the_level() -> None:
    async def flaky(ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
        yield Chunk(1)
        if len(ids) == 3:
            msg = "engine said no"
            raise RuntimeError(msg)
        yield Chunk(1)

    result = run(flaky, scenario(), 2, n=2, warmup=1)
    rows = result.requests.to_pylist()
    assert [r["error"] for r in rows] == ["RuntimeError: engine said no"] * 2
    assert all(r["ttft_s"] is None and r["itl_s"] is None for r in rows)
    assert result.level.to_pylist()[0]["n_errors"] == 2

    async def broken(ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
        msg = "down"
        raise ConnectionError(msg)
        yield Chunk(0)  # pragma: no cover

    with pytest.raises(RuntimeError, match="warm-up request failed: ConnectionError: down"):
        run(broken, scenario(), 1, n=1, warmup=1)


def _request(i: int, ttft: float, itl: list[float], e2e: float, **kw: Any) -> dict[str, Any]:
    n = len(itl) + 1
    return {
        "model": "m", "model_weights": "w", "target": "t", "scenario": "s", "level": 2, "request_index": i,
        "scheduled_s": 0.0, "sent_s": kw.get("delay", 0.0), "queue_delay_s": kw.get("delay", 0.0),
        "ttft_s": ttft, "tpot_s": sum(itl) / len(itl) if itl else None, "e2e_s": e2e, "itl_s": itl,
        "n_prompt_tokens": 100, "n_output_tokens": n, "n_chunks": n,
        "engine_ttft_s": kw.get("engine_ttft"), "error": kw.get("error"),
    }  # fmt: skip


def mixed_level() -> tuple[pl.DataFrame, pl.DataFrame]:
    """(perf_requests, perf_levels) of one level of five requests: with several tokens, one token
    only, a send delay, and a failed one; 2 s of wall time."""
    rows = [
        _request(0, 0.2, [0.1, 0.1, 0.1, 0.1], 0.6),
        _request(1, 0.4, [0.1, 0.1, 0.1, 0.5], 1.2, delay=0.05),
        _request(2, 0.3, [], 0.3),
        _request(3, 0.0, [], 0.0, error="HTTPError: 500") | {"ttft_s": None, "e2e_s": None},
        _request(4, 0.25, [0.2, 0.3], 0.75),
    ]
    requests = pl.DataFrame(rows, schema=pl.from_arrow(perf_schema.PERF_REQUESTS.empty_table()).schema)  # type: ignore[union-attr]
    levels = pl.DataFrame([{"model": "m", "model_weights": "w", "target": "t", "scenario": "s", "level": 2}])
    return requests, levels.with_columns(wall_s=pl.lit(2.0), request_rate=pl.lit(None, pl.Float64))


def test_summary_matches_hand_computed_figures() -> None:
    requests = pl.DataFrame(
        [
            _request(0, 0.2, [0.1, 0.1, 0.1, 0.1], 0.6, engine_ttft=0.15),
            # A 3-token chunk after 0.3 s: three gaps of 0.1 (actors/send_loop.py), then one of 0.5.
            _request(1, 0.4, [0.1, 0.1, 0.1, 0.5], 1.2, delay=0.05, engine_ttft=0.25),
            _request(2, 0.3, [], 0.3, delay=0.01),  # one token: no TPOT, no gaps
            _request(3, 0.0, [], 0.0, delay=0.3, error="HTTPError: 500") | {"ttft_s": None, "e2e_s": None},
        ],
        schema=pl.from_arrow(perf_schema.PERF_REQUESTS.empty_table()).schema,  # type: ignore[union-attr]
    )
    levels = pl.DataFrame(
        [{"model": "m", "model_weights": "w", "target": "t", "scenario": "s", "level": 2, "wall_s": 2.0}],
    )
    [row] = fleet_perf.summary(requests, levels.with_columns(request_rate=pl.lit(None, pl.Float64))).to_dicts()
    assert (row["n_requests"], row["n_completed"], row["n_errors"]) == (4, 3, 1)
    assert row["qps"] == pytest.approx(3 / 2.0)
    assert row["output_tok_s"] == pytest.approx((5 + 5 + 1) / 2.0)
    assert row["total_tok_s"] == pytest.approx((300 + 11) / 2.0)
    assert row["prefill_tok_s"] == pytest.approx(300 / (0.2 + 0.4 + 0.3))
    assert row["ttft_mean_s"] == pytest.approx(0.3)
    assert row["ttft_p50_s"] == pytest.approx(0.3)
    assert row["ttft_p90_s"] == pytest.approx(0.38)  # linear: 0.3 + 0.8 * (0.4 - 0.3)
    assert row["tpot_mean_s"] == pytest.approx((0.1 + 0.2) / 2)
    assert row["tpot_p99_s"] == pytest.approx(0.1 + 0.99 * 0.1)
    itl = [0.1] * 7 + [0.5]
    assert row["itl_mean_s"] == pytest.approx(sum(itl) / 8)
    assert row["itl_p50_s"] == pytest.approx(0.1)
    assert row["itl_p90_s"] == pytest.approx(0.1 + (0.9 * 7 - 6) * 0.4)  # between the 7th and 8th gap
    assert row["e2e_mean_s"] == pytest.approx(0.7)
    assert row["queue_delay_max_s"] == pytest.approx(0.3)
    assert row["queue_delay_mean_s"] == pytest.approx((0.0 + 0.05 + 0.01 + 0.3) / 4)
    assert row["engine_ttft_mean_s"] == pytest.approx(0.2)
    assert row["goodput_qps"] is None and row["slo_share"] is None  # no SLO set: no goodput, not 0


def test_goodput_is_vllms_rule() -> None:
    """Goodput against an SLO, the figures computed here as vLLM's `--goodput` does (vllm/benchmarks/
    serve.py calculate_metrics): tpot = (e2e - ttft) / (n - 1), 0 for one token; a request is good
    when every limit >= its value; good / duration."""
    requests = pl.DataFrame(
        [
            _request(0, 0.2, [0.1, 0.1, 0.1, 0.1], 0.6),  # tpot 0.1: good
            _request(1, 0.4, [0.1, 0.1, 0.1, 0.5], 1.2),  # tpot 0.2: misses tpot <= 0.15
            _request(2, 0.3, [], 0.3),  # one token: tpot 0 in vLLM's rule; good
            _request(3, 0.5, [0.1, 0.1], 0.7),  # ttft 0.5: misses ttft <= 0.45
            _request(4, 0.0, [], 0.0, error="HTTPError: 500") | {"ttft_s": None, "e2e_s": None},  # failed: not good
        ],
        schema=pl.from_arrow(perf_schema.PERF_REQUESTS.empty_table()).schema,  # type: ignore[union-attr]
    )
    levels = pl.DataFrame(
        [{"model": "m", "model_weights": "w", "target": "t", "scenario": "s", "level": 2, "wall_s": 2.0}],
    ).with_columns(request_rate=pl.lit(None, pl.Float64))
    slo = {"ttft_s": 0.45, "tpot_s": 0.15, "e2e_s": 1.0}
    [row] = fleet_perf.summary(requests, levels, {"s": slo}).to_dicts()

    def vllm_good(r: dict[str, Any]) -> bool:  # the rule as vLLM's code states it, on the raw rows
        n = r["n_output_tokens"]
        tpot = (r["e2e_s"] - r["ttft_s"]) / (n - 1) if n > 1 else 0.0
        return r["error"] is None and all(
            lim >= v for lim, v in zip(slo.values(), (r["ttft_s"], tpot, r["e2e_s"]), strict=True)
        )

    good = [r for r in requests.to_dicts() if vllm_good(r)]
    assert [r["request_index"] for r in good] == [0, 2]
    # The row-at-a-time rule a sweep judges its probes by as it runs (actors/sweep.py) agrees.
    assert [r["request_index"] for r in requests.to_dicts() if Slo(**slo).met(r)] == [0, 2]
    assert row["goodput_qps"] == pytest.approx(len(good) / 2.0)
    assert row["goodput_tok_s"] == pytest.approx(sum(r["n_output_tokens"] for r in good) / 2.0)
    assert row["slo_share"] == pytest.approx(2 / 5)
    [other] = fleet_perf.summary(requests, levels, {"another-scenario": slo}).to_dicts()
    assert other["goodput_qps"] is None  # an SLO applies to its own scenario only
