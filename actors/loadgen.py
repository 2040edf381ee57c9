"""The load generator of the perf scenarios: the asyncio loop that sends a level's requests
(actors/workloads.py builds them) on the scenario's schedule and turns an engine's token stream into
per-request latency rows.

It is engine-neutral: an engine hands `measure_level` a `stream(prompt_token_ids, max_tokens)`
callable yielding `Chunk`s (how many new tokens each carries, and at the end the engine's own
figures and its count of the prompt), plus keyword options only where a scenario needs them
(`Request.send_options`: free output, text or chat messages). Every chunk is stamped with
time.perf_counter as the client receives it. A chunk of k tokens counts as k tokens, each after
gap/k: load testers that count one token per chunk (or charge the whole gap to one token)
overstate inter-token latency whenever the server batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# encode, level_seed and synthetic_prompts are named here by engines and tests (actors/workloads.py has them).
from actors.workloads import Request, encode, level_requests, level_seed, synthetic_prompts  # noqa: F401
from fleet.contracts.engine import Chunk, EngineStats, PerfResult

if TYPE_CHECKING:
    from fleet.contracts.engine import Engine
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.spec import Scenario


# stream(ids, max_tokens, **Request.send_options()): the options only where a scenario needs them.
Stream = Callable[..., AsyncGenerator[Chunk, None]]
# The engine's prefix-cache counters (queries, hits) in tokens, or None where it reports none.
CacheCounters = Callable[[], Awaitable[tuple[int, int] | None]]


def as_request(prompt: list[int] | Request, scenario: Scenario) -> Request:
    """A bare list of prompt ids as a request for the scenario's fixed output length."""
    if isinstance(prompt, Request):
        return prompt
    out = scenario.output_tokens if isinstance(scenario.output_tokens, int) else scenario.output_tokens.upper
    return Request(prompt, out, len(prompt), out if scenario.ignore_eos else None)


def prompt_ids(
    scenario: Scenario, tokenizer: Any, prompts: Sequence[str | Prompt] | None = None, *, level: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(measured, warm-up) prompt token ids of one level, as the model sees them (`level_requests`)."""
    measured, warmup = level_requests(scenario, tokenizer, prompts, level=level)
    return [r.ids for r in measured], [r.ids for r in warmup]


def check_fits(scenario: Scenario, prompts: Sequence[list[int] | Request], max_model_len: int) -> None:
    """Fail before sending anything when a request cannot fit the engine's context."""
    requests = [as_request(p, scenario) for p in prompts]
    longest = max((len(r.ids) + r.max_tokens for r in requests), default=0)
    if longest > max_model_len:
        msg = (
            f"scenario {scenario.name!r}: prompt + output reach {longest} tokens, "
            f"more than the target's max_model_len {max_model_len}"
        )
        raise ValueError(msg)


def prepare_level(
    engine: Engine,
    scenario: Scenario,
    level: int,
    prompts: Sequence[str | Prompt] | None,
    *,
    tokenizer: Any,
    max_model_len: int | None,
) -> Callable[[Stream, CacheCounters | None], Coroutine[Any, Any, PerfResult]]:
    """Tokenize one level's prompts and check them against the context now, before anything is
    sent; return `measure(stream, cache)`, which runs the level on the engine's stream (`measure_level`)."""
    measured, warmup = level_requests(scenario, tokenizer, prompts, level=level)
    if max_model_len:
        check_fits(scenario, measured + warmup, max_model_len)
    model, target = engine.model, engine.args.name

    def measure(stream: Stream, cache: CacheCounters | None = None) -> Coroutine[Any, Any, PerfResult]:
        return measure_level(
            stream,
            scenario,
            level,
            prompts=measured,
            warmup=warmup,
            model=model.name,
            model_weights=model.weights,
            target=target,
            cache=cache,
        )

    return measure


def _now() -> float:
    """The load generator's clock (a function so tests can substitute a scripted one)."""
    return time.perf_counter()


@dataclass
class _Timing:
    index: int
    scheduled: float
    request: Request
    sent: float | None = None
    ended: float | None = None
    first: float | None = None
    last: float | None = None
    n_out: int = 0
    n_prompt_reported: int | None = None  # the engine's own count of the prompt, where it reports one
    n_chunks: int = 0
    itl: list[float] = field(default_factory=list)
    stats: EngineStats | None = None
    error: str | None = None


async def _one(stream: Stream, t: _Timing) -> None:
    r = t.request
    t.sent = _now()
    async with contextlib.aclosing(stream(r.ids, r.max_tokens, **r.send_options())) as chunks:
        async for chunk in chunks:
            now = _now()
            if chunk.stats is not None:
                t.stats = chunk.stats
            if chunk.n_prompt_tokens is not None:
                t.n_prompt_reported = chunk.n_prompt_tokens
            if chunk.n_tokens <= 0:
                continue
            # Tokens beyond the first in the first chunk arrived with it: gap 0. Later chunks spread
            # their gap over their tokens, so sum(itl) = last - first and mean(itl) = TPOT.
            gap = 0.0 if t.last is None else (now - t.last) / chunk.n_tokens
            t.itl.extend([gap] * (chunk.n_tokens - (1 if t.last is None else 0)))
            t.first = now if t.first is None else t.first
            t.last = now
            t.n_out += chunk.n_tokens
            t.n_chunks += 1


def _gap(rng: random.Random, rate: float, burstiness: float) -> float:
    """The time to the next arrival: vLLM's --burstiness, a gamma of shape `burstiness` and scale
    1 / (rate * burstiness) (mean 1 / rate); at 1, the exponential gap of a Poisson process, drawn
    as before so that a seed keeps its schedule."""
    return rng.expovariate(rate) if burstiness == 1 else rng.gammavariate(burstiness, 1 / (rate * burstiness))


def arrivals(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds from a level's start at which each of `n` requests is due: seeded gaps (`_gap`),
    summed, then scaled so the last is due at n / rate, as vLLM's serving benchmark does
    (vllm/benchmarks/serve.py `get_request`): every seed then offers the same mean rate, so
    throughput figures compare across seeds and with `vllm bench serve`."""
    rng, total, out = random.Random(seed), 0.0, []
    for _ in range(n):
        total += _gap(rng, rate, burstiness)
        out.append(total)
    scale = (n / rate) / total if total > 0 else 1.0
    return [t * scale for t in out]


async def _schedule(
    stream: Stream,
    requests: Sequence[Request],
    *,
    level: int,
    rate: float | None,
    seed: int,
    burstiness: float = 1.0,
) -> tuple[float, float, list[_Timing]]:
    """Send `requests` with at most `level` in flight: (start on perf_counter, on the wall clock, timings).
    A trace's requests are due at their own offsets; a multi-turn request waits for its previous turn."""
    start, started_at = _now(), time.time()
    # Every slot remembers when it became free: in a closed loop that is when the next request is due.
    free_at: asyncio.Queue[float] = asyncio.Queue()
    for _ in range(level):
        free_at.put_nowait(start)
    timings: list[_Timing] = []
    tasks: list[asyncio.Task[None]] = []
    offsets: list[float] | None = None  # None: closed loop
    if any(r.offset_s is not None for r in requests):  # a trace: its own times, not drawn ones
        offsets = [r.offset_s or 0.0 for r in requests]
    elif rate is not None:
        offsets = arrivals(len(requests), rate, burstiness, seed)
    answered = [asyncio.Event() for _ in requests]

    async def run(t: _Timing) -> None:
        try:
            if (before := t.request.after) is not None:
                await answered[before].wait()
                t.scheduled = max(t.scheduled, timings[before].ended or t.scheduled)  # due once answered
            await _one(stream, t)
        except Exception as e:  # noqa: BLE001  (a failed request is a row, not the end of the level)
            t.error = f"{type(e).__name__}: {e}"[:500]
        finally:
            t.ended = _now()
            answered[t.index].set()
            free_at.put_nowait(t.ended)

    for i, request in enumerate(requests):
        due = start + offsets[i] if offsets is not None else start
        if offsets is not None:
            await asyncio.sleep(max(0.0, due - _now()))
        freed = await free_at.get()
        t = _Timing(index=i, scheduled=due if offsets is not None else freed, request=request)
        timings.append(t)
        tasks.append(asyncio.create_task(run(t)))
    await asyncio.gather(*tasks)
    return start, started_at, timings


async def measure_level(
    stream: Stream,
    scenario: Scenario,
    level: int,
    *,
    prompts: Sequence[list[int] | Request],
    warmup: Sequence[list[int] | Request],
    model: str,
    model_weights: str,
    target: str,
    cache: CacheCounters | None = None,
) -> PerfResult:
    """Warm up (unrecorded, closed loop), then send `prompts` on the scenario's schedule at `level`;
    `cache` reads the engine's prefix-cache counters, before and after the measured requests."""
    warm_requests = [as_request(p, scenario) for p in warmup]
    *_, warm = await _schedule(stream, warm_requests, level=level, rate=None, seed=scenario.seed)
    if failed := [t.error for t in warm if t.error]:
        msg = f"scenario {scenario.name!r} level {level}: warm-up request failed: {failed[0]}"
        raise RuntimeError(msg)
    before = await cache() if cache else None
    start, started_at, timings = await _schedule(
        stream,
        [as_request(p, scenario) for p in prompts],
        level=level,
        rate=scenario.request_rate,
        seed=scenario.seed,
        burstiness=scenario.burstiness,
    )
    wall = max((t.ended or start for t in timings), default=start) - start
    after = await cache() if cache and before is not None else None
    keys = {"model": model, "model_weights": model_weights, "target": target, "scenario": scenario.name, "level": level}
    hits: dict[str, int | None] = {"prefix_cache_queries": None, "prefix_cache_hits": None}
    if before is not None and after is not None:
        hits = {"prefix_cache_queries": after[0] - before[0], "prefix_cache_hits": after[1] - before[1]}
    return _tables(keys, scenario, start, started_at, wall, timings, hits)


def _tables(
    keys: dict[str, Any],
    scenario: Scenario,
    start: float,
    started_at: float,
    wall: float,
    timings: list[_Timing],
    cache_hits: dict[str, int | None],
) -> PerfResult:
    import datetime as dt
    import socket

    import pyarrow as pa

    from fleet.contracts import schema

    def since(x: float | None, origin: float | None) -> float | None:
        return None if x is None or origin is None else x - origin

    rows = []
    for t in timings:
        s = t.stats or EngineStats()
        done = t.error is None
        rows.append(
            keys
            | {
                "request_index": t.index,
                "scheduled_s": t.scheduled - start,
                "sent_s": since(t.sent, start),
                "queue_delay_s": since(t.sent, t.scheduled),
                "ttft_s": since(t.first, t.sent) if done else None,
                "tpot_s": (t.last - t.first) / (t.n_out - 1) if done and t.first and t.last and t.n_out > 1 else None,
                "e2e_s": since(t.last, t.sent) if done else None,
                "itl_s": t.itl if done else None,
                "n_prompt_tokens": t.n_prompt_reported if t.n_prompt_reported is not None else len(t.request.ids),
                "n_output_tokens": t.n_out,
                "n_chunks": t.n_chunks,
                "engine_queue_s": s.queue_s,
                "engine_ttft_s": s.ttft_s,
                "engine_tpot_s": s.tpot_s,
                "error": t.error,
                "requested_prompt_tokens": t.request.requested_input,
                "requested_output_tokens": t.request.requested_output,
            }
        )
    level_row = (
        keys
        | {
            "request_rate": scenario.request_rate,
            "n_requests": len(timings),
            "n_errors": sum(t.error is not None for t in timings),
            "started_at": dt.datetime.fromtimestamp(started_at, tz=dt.UTC),
            "wall_s": wall,
            "hostname": socket.gethostname(),
        }
        | cache_hits
    )
    requests = pa.Table.from_pylist(rows, schema=schema.PERF_REQUESTS) if rows else schema.PERF_REQUESTS.empty_table()
    return PerfResult(requests, pa.Table.from_pylist([level_row], schema=schema.PERF_LEVELS))
