"""The load generator of the perf scenarios: the asyncio loop that sends a level's requests
(actors/workloads.py builds them) on the scenario's schedule (actors/arrivals.py, or a trace's own
times) and turns an engine's token stream into per-request latency rows.

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
import dataclasses
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from actors.arrivals import scenario_schedule

# encode, prompt_ids, check_fits, level_seed and synthetic_prompts are named here by engines and tests
# (actors/workloads.py has them).
from actors.workloads import (  # noqa: F401
    Request,
    as_request,
    check_fits,
    encode,
    fixed_output,
    level_requests,
    level_seed,
    prompt_ids,
    synthetic_prompts,
    trace_offsets,
)
from fleet.contracts.engine import Chunk, EngineStats, PerfResult

if TYPE_CHECKING:
    from fleet.contracts.engine import Engine
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.scenario import Scenario


# stream(ids, max_tokens, **Request.send_options()): the options only where a scenario needs them.
Stream = Callable[..., AsyncGenerator[Chunk, None]]
# Called in the event loop as each measured request is sent, with its index: what else a level
# sends beside its load hooks in here (parity under load, actors/load_parity.py).
OnSend = Callable[[int], None]
# The engine's prefix-cache counters (queries, hits) in tokens, or None where it reports none.
CacheCounters = Callable[[], Awaitable["tuple[int, int] | None"]]


def prepare_level(
    engine: Engine,
    scenario: Scenario,
    level: int,
    prompts: Sequence[str | Prompt] | None,
    *,
    tokenizer: Any,
    max_model_len: int | None,
) -> Callable[..., Coroutine[Any, Any, PerfResult]]:
    """Tokenize one level's prompts and check them against the context now, before anything is
    sent; return `measure(stream, send=None, on_send=None, *, cache=None)`, which runs the level
    (`measure_level`)."""
    measured, warmup = level_requests(scenario, tokenizer, prompts, level=level)
    if max_model_len:
        check_fits(scenario, measured + warmup, max_model_len)
    model, target = engine.model, engine.args.name

    def measure(
        stream: Stream | None,
        send: Send | None = None,
        on_send: OnSend | None = None,
        *,
        cache: CacheCounters | None = None,
    ) -> Coroutine[Any, Any, PerfResult]:
        return measure_level(
            stream,
            scenario,
            level,
            prompts=measured,
            warmup=warmup,
            model=model.name,
            model_weights=model.weights,
            target=target,
            send=send,
            on_send=on_send,
            cache=cache,
        )

    return measure


def _now() -> float:
    """The load generator's clock (a function so tests can substitute a scripted one)."""
    return time.perf_counter()


@dataclass
class Timing:
    """One request as the client saw it, in seconds from the run's start (all clients share it)."""

    index: int
    scheduled: float
    n_prompt: int  # the engine's own count of the prompt where it reports one, else the ids sent
    requested_input: int | None = None  # what the workload asked for (actors/workloads.py Request)
    requested_output: int | None = None
    ready: float = 0.0  # when it could go: due, and a slot free
    sent: float | None = None
    ended: float | None = None
    first: float | None = None
    last: float | None = None
    n_out: int = 0
    n_chunks: int = 0
    itl: list[float] = field(default_factory=list)
    stats: EngineStats | None = None
    error: str | None = None
    client: int = 0

    def shifted(self, origin: float) -> Timing:
        """The same timing with every clock reading taken from `origin`."""

        def at(x: float | None) -> float | None:
            return None if x is None else x - origin

        moved = dataclasses.replace(self, scheduled=self.scheduled - origin, ready=self.ready - origin)
        moved.sent, moved.ended, moved.first, moved.last = (
            at(x) for x in (self.sent, self.ended, self.first, self.last)
        )
        return moved


@dataclass
class Sent:
    """One run of a level: its requests' timings (from its start), when it started (wall clock), and
    the CPU seconds the client's event-loop thread spent on it (the busiest client's, when several)."""

    timings: list[Timing]
    started_at: float
    client_cpu_s: float
    clients: int = 1
    hostname: str | None = None  # the clients' nodes; None: this one
    prefix_cache: tuple[int, int] | None = None  # the engine's prefix-cache (queries, hits) during the run


async def _one(stream: Stream, r: Request, t: Timing) -> None:
    t.sent = _now()
    async with contextlib.aclosing(stream(r.ids, r.max_tokens, **r.send_options())) as chunks:
        async for chunk in chunks:
            now = _now()
            if chunk.stats is not None:
                t.stats = chunk.stats
            if chunk.n_prompt_tokens is not None:
                t.n_prompt = chunk.n_prompt_tokens
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


async def send(
    stream: Stream,
    prompts: Sequence[list[int] | Request],
    max_tokens: int,
    *,
    level: int,
    offsets: list[float] | None,
    indices: Sequence[int] | None = None,
    start_at: float | None = None,
    client: int = 0,
    on_send: OnSend | None = None,
) -> Sent:
    """Send `prompts` with at most `level` in flight, each due at its `offsets` entry (seconds from
    the start; None: a closed loop, each due when a slot frees). `indices` number the requests (default
    0..n-1); `start_at` (wall clock) is a start shared with other clients (default: now); `on_send(i)`
    as the i-th is sent. Bare ids ask for exactly `max_tokens` tokens; a `Request` carries its own, and
    one with `after` (a multi-turn turn) waits for that earlier request of `prompts` to be answered."""
    if start_at is not None:
        await asyncio.sleep(max(0.0, start_at - time.time()))
    cpu0, start, started_at = time.thread_time(), _now(), time.time() if start_at is None else start_at
    # Every slot remembers when it became free: in a closed loop that is when the next request is due.
    free_at: asyncio.Queue[float] = asyncio.Queue()
    for _ in range(level):
        free_at.put_nowait(start)
    timings: list[Timing] = []
    tasks: list[asyncio.Task[None]] = []
    requests = [as_request(p, max_tokens) for p in prompts]
    answered = [asyncio.Event() for _ in requests]

    async def run(position: int, r: Request, t: Timing) -> None:
        try:
            if r.after is not None:  # due once the previous turn is answered
                await answered[r.after].wait()
                t.scheduled = max(t.scheduled, timings[r.after].ended or t.scheduled)
                t.ready = max(t.ready, t.scheduled)
            await _one(stream, r, t)
        except Exception as e:  # noqa: BLE001  (a failed request is a row, not the end of the level)
            t.error = f"{type(e).__name__}: {e}"[:500]
        finally:
            t.ended = _now()
            answered[position].set()
            free_at.put_nowait(t.ended)

    for i, r in enumerate(requests):
        due = start + offsets[i] if offsets is not None else start
        if offsets is not None:
            await asyncio.sleep(max(0.0, due - _now()))
        freed = await free_at.get()
        index = indices[i] if indices is not None else i
        t = Timing(
            index=index,
            scheduled=due if offsets is not None else freed,
            n_prompt=len(r.ids),
            requested_input=r.requested_input,
            requested_output=r.requested_output,
            client=client,
        )
        t.ready = max(due, freed)
        timings.append(t)
        tasks.append(asyncio.create_task(run(i, r, t)))
        if on_send is not None:
            on_send(i)
    await asyncio.gather(*tasks)
    return Sent([t.shifted(start) for t in timings], started_at, time.thread_time() - cpu0)


# send(requests, offsets, level, max_tokens): one run of a level, in this process (`local`) or over
# client actors (actors/load_clients.py); max_tokens for bare ids only (a Request has its own).
Send = Callable[[Sequence["list[int] | Request"], "list[float] | None", int, int], Awaitable[Sent]]


def local(stream: Stream, *, on_send: OnSend | None = None) -> Send:
    """A `Send` that runs in this process on `stream` (actors/load_clients.py spreads one over actors)."""

    def run(
        prompts: Sequence[list[int] | Request], offsets: list[float] | None, level: int, max_tokens: int
    ) -> Awaitable[Sent]:
        return send(stream, prompts, max_tokens, level=level, offsets=offsets, on_send=on_send)

    return run


async def measure_level(
    stream: Stream | None,
    scenario: Scenario,
    level: int,
    *,
    prompts: Sequence[list[int] | Request],
    warmup: Sequence[list[int] | Request],
    model: str,
    model_weights: str,
    target: str,
    send: Send | None = None,
    on_send: OnSend | None = None,
    cache: CacheCounters | None = None,
) -> PerfResult:
    """Warm up (unrecorded, closed loop), then send `prompts` on the scenario's schedule at `level`
    (a sweep: several runs, actors/sweep.py), on `stream` in this process or through `send`
    (several client processes, actors/load_clients.py); `on_send(i)` as the i-th measured request is
    sent (in this process only: parity under load rides one client's event loop); `cache` reads the
    engine's prefix-cache counters before and after each measured run. A trace's requests are due at
    the trace's own offsets, in place of the scenario's arrival pattern."""
    from actors import sweep

    if send is not None and on_send is not None:
        msg = f"scenario {scenario.name!r}: parity under load needs the load sent from the engine's actor (clients: 1)"
        raise ValueError(msg)
    if send is None:
        assert stream is not None, "measure_level needs a stream or a send"
        send = local(stream)
    run = send
    measured_run = counted(run if on_send is None or stream is None else local(stream, on_send=on_send), cache)
    out = fixed_output(scenario)
    warm = (await run(warmup, None, level, out)).timings
    if failed := [t.error for t in warm if t.error]:
        msg = f"scenario {scenario.name!r} level {level}: warm-up request failed: {failed[0]}"
        raise RuntimeError(msg)
    keys = {"model": model, "model_weights": model_weights, "target": target, "scenario": scenario.name, "level": level}
    if scenario.sweep is not None:

        async def run_probe(batch: Any, offsets: list[float] | None, rate: float | None, index: int) -> PerfResult:
            return tables(keys, rate, await measured_run(batch, offsets, level, out), probe=index)

        return await sweep.search(run_probe, scenario, level, prompts=prompts)
    offsets = trace_offsets(prompts)
    sent = await measured_run(prompts, offsets or scenario_schedule(scenario, len(prompts)), level, out)
    return tables(keys, scenario.request_rate, sent)


def tables(keys: dict[str, Any], rate: float | None, sent: Sent, *, probe: int = 0) -> PerfResult:
    """The perf_requests rows and the perf_levels row of one run of a level."""
    import datetime as dt
    import socket

    import pyarrow as pa

    from fleet.contracts import schema

    def since(x: float | None, origin: float | None) -> float | None:
        return None if x is None or origin is None else x - origin

    timings = sorted(sent.timings, key=lambda t: t.index)  # times are from the run's start
    rows = []
    for t in timings:
        s = t.stats or EngineStats()
        done = t.error is None
        rows.append(
            keys
            | {
                "request_index": t.index,
                "scheduled_s": t.scheduled,
                "sent_s": t.sent,
                "queue_delay_s": since(t.sent, t.scheduled),
                "ttft_s": since(t.first, t.sent) if done else None,
                "tpot_s": (t.last - t.first) / (t.n_out - 1)
                if done and t.first is not None and t.last is not None and t.n_out > 1
                else None,
                "e2e_s": since(t.last, t.sent) if done else None,
                "itl_s": t.itl if done else None,
                "n_prompt_tokens": t.n_prompt,
                "n_output_tokens": t.n_out,
                "n_chunks": t.n_chunks,
                "engine_queue_s": s.queue_s,
                "engine_ttft_s": s.ttft_s,
                "engine_tpot_s": s.tpot_s,
                "error": t.error,
                "probe": probe,
                "send_lag_s": since(t.sent, t.ready),
                "client": t.client,
                "requested_prompt_tokens": t.requested_input,
                "requested_output_tokens": t.requested_output,
            }
        )
    level_row = keys | {
        "request_rate": rate,
        "n_requests": len(timings),
        "n_errors": sum(t.error is not None for t in timings),
        "started_at": dt.datetime.fromtimestamp(sent.started_at, tz=dt.UTC),
        "wall_s": max((t.ended or 0.0 for t in timings), default=0.0),  # first due to last done
        "hostname": sent.hostname or socket.gethostname(),
        "probe": probe,
        "clients": sent.clients,
        "client_cpu_s": sent.client_cpu_s,
        "prefix_cache_queries": sent.prefix_cache[0] if sent.prefix_cache else None,
        "prefix_cache_hits": sent.prefix_cache[1] if sent.prefix_cache else None,
    }
    requests = pa.Table.from_pylist(rows, schema=schema.PERF_REQUESTS) if rows else schema.PERF_REQUESTS.empty_table()
    return PerfResult(requests, pa.Table.from_pylist([level_row], schema=schema.PERF_LEVELS))


def counted(run: Send, cache: CacheCounters | None) -> Send:
    """`run` with the engine's prefix-cache counters read around it, their difference in `Sent.prefix_cache`
    (None where the engine reports none)."""
    if cache is None:
        return run

    async def counted_run(
        prompts: Sequence[list[int] | Request], offsets: list[float] | None, level: int, max_tokens: int
    ) -> Sent:
        before = await cache()
        sent = await run(prompts, offsets, level, max_tokens)
        after = await cache() if before is not None else None
        if before is not None and after is not None:
            sent.prefix_cache = (after[0] - before[0], after[1] - before[1])
        return sent

    return counted_run
