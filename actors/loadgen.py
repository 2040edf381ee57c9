"""The load generator of the perf scenarios: synthetic prompts of an exact token length,
and the asyncio loop that turns an engine's token stream into per-request latency rows.

It is engine-neutral: an engine hands `measure_level` a `stream(prompt_token_ids, max_tokens)`
callable yielding `Chunk`s (how many new tokens each carries, and at the end the engine's own
figures). Every chunk is stamped with time.perf_counter as the client receives it. A chunk of k
tokens counts as k tokens, each after gap/k: load testers that count one token per chunk (or
charge the whole gap to one token) overstate inter-token latency whenever the server batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import statistics
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from actors.arrivals import scenario_schedule
from fleet.contracts.engine import Chunk, EngineStats, PerfResult

if TYPE_CHECKING:
    from fleet.contracts.engine import Engine
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.spec import Scenario


Stream = Callable[[list[int], int], AsyncGenerator[Chunk, None]]
# Called in the event loop as each measured request is sent, with its index: what else a level
# sends beside its load hooks in here (parity under load, actors/load_parity.py).
OnSend = Callable[[int], None]


def synthetic_prompts(tokenizer: Any, *, n: int, length: int, seed: int) -> list[list[int]]:
    """`n` prompts of exactly `length` token ids, the same for the same tokenizer and seed.

    Ids are drawn uniformly from the non-special vocabulary after the BOS token the tokenizer
    would add itself, so prompts look like tokenized text to the engine and share no prefix
    beyond BOS (prefix caching cannot turn prefill into a cache hit).
    """
    special = set(tokenizer.all_special_ids)
    pool = [i for i in range(len(tokenizer)) if i not in special]
    bos = tokenizer.bos_token_id
    head = [bos] if bos is not None and tokenizer("a").input_ids[:1] == [bos] else []
    rng = random.Random(seed)
    return [(head + [rng.choice(pool) for _ in range(length)])[:length] for _ in range(n)]


def encode(tokenizer: Any, prompt: str | Prompt) -> list[int]:
    """Token ids of a text prompt, or of chat messages through the model's chat template."""
    if isinstance(prompt, str) or prompt.messages is None:
        text = prompt if isinstance(prompt, str) else prompt.prompt
        return list(tokenizer(text).input_ids)
    messages = [m.model_dump() for m in prompt.messages]
    # As the HF reference renders chat: the template's text, tokenized without adding specials again.
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def level_seed(scenario: Scenario, level: int) -> int:
    """The seed of one level's synthetic prompts: each level sends fresh prompts, so a later level
    never finds an earlier level's prompts in the prefix cache."""
    return scenario.seed + 7919 * level


def _measured_count(scenario: Scenario) -> int:
    """Measured requests of one level: num_requests per run, a sweep's runs each with fresh prompts."""
    return scenario.num_requests * (scenario.sweep.runs if scenario.sweep else 1)


def prompt_ids(
    scenario: Scenario, tokenizer: Any, prompts: Sequence[str | Prompt] | None = None, *, level: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(measured, warm-up) prompt token ids for one concurrency level. Warm-up prompts are always
    synthetic (a different seed), so they never leave the measured prompts in the prefix cache.
    A prompt-set scenario sends the set's own prompts at every level (turn prefix caching off in
    `engine_args` to keep later levels from hitting it)."""
    seed = level_seed(scenario, level)
    if scenario.input_tokens is not None:
        length = scenario.input_tokens
        measured = synthetic_prompts(tokenizer, n=_measured_count(scenario), length=length, seed=seed)
    else:
        if not prompts:
            msg = f"scenario {scenario.name!r} uses prompt set {scenario.prompt_set!r}: pass its prompts"
            raise ValueError(msg)
        encoded = [encode(tokenizer, p) for p in prompts]
        measured = [encoded[i % len(encoded)] for i in range(_measured_count(scenario))]
        length = int(statistics.median(len(ids) for ids in encoded))
    warmup = synthetic_prompts(tokenizer, n=scenario.warmup_requests, length=length, seed=seed + 1_000_003)
    return measured, warmup


def check_fits(scenario: Scenario, prompts: list[list[int]], max_model_len: int) -> None:
    """Fail before sending anything when a request cannot fit the engine's context."""
    longest = max((len(p) for p in prompts), default=0) + scenario.output_tokens
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
) -> Callable[..., Coroutine[Any, Any, PerfResult]]:
    """Tokenize one level's prompts and check them against the context now, before anything is
    sent; return `measure(stream, send=None, on_send=None)`, which runs the level (`measure_level`)."""
    measured, warmup = prompt_ids(scenario, tokenizer, prompts, level=level)
    if max_model_len:
        check_fits(scenario, measured + warmup, max_model_len)
    model, target = engine.model, engine.args.name

    def measure(
        stream: Stream | None, send: Send | None = None, on_send: OnSend | None = None
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
    n_prompt: int
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


async def _one(stream: Stream, ids: list[int], max_tokens: int, t: Timing) -> None:
    t.sent = _now()
    async with contextlib.aclosing(stream(ids, max_tokens)) as chunks:
        async for chunk in chunks:
            now = _now()
            if chunk.stats is not None:
                t.stats = chunk.stats
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
    prompts: list[list[int]],
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
    as the i-th is sent."""
    if start_at is not None:
        await asyncio.sleep(max(0.0, start_at - time.time()))
    cpu0, start, started_at = time.thread_time(), _now(), time.time() if start_at is None else start_at
    # Every slot remembers when it became free: in a closed loop that is when the next request is due.
    free_at: asyncio.Queue[float] = asyncio.Queue()
    for _ in range(level):
        free_at.put_nowait(start)
    timings: list[Timing] = []
    tasks: list[asyncio.Task[None]] = []

    async def run(ids: list[int], t: Timing) -> None:
        try:
            await _one(stream, ids, max_tokens, t)
        except Exception as e:  # noqa: BLE001  (a failed request is a row, not the end of the level)
            t.error = f"{type(e).__name__}: {e}"[:500]
        finally:
            t.ended = _now()
            free_at.put_nowait(t.ended)

    for i, ids in enumerate(prompts):
        due = start + offsets[i] if offsets is not None else start
        if offsets is not None:
            await asyncio.sleep(max(0.0, due - _now()))
        freed = await free_at.get()
        index = indices[i] if indices is not None else i
        t = Timing(index=index, scheduled=due if offsets is not None else freed, n_prompt=len(ids), client=client)
        t.ready = max(due, freed)
        timings.append(t)
        tasks.append(asyncio.create_task(run(ids, t)))
        if on_send is not None:
            on_send(i)
    await asyncio.gather(*tasks)
    return Sent([t.shifted(start) for t in timings], started_at, time.thread_time() - cpu0)


Send = Callable[[list[list[int]], "list[float] | None", int, int], Awaitable[Sent]]


def local(stream: Stream, *, on_send: OnSend | None = None) -> Send:
    """A `Send` that runs in this process on `stream` (actors/load_clients.py spreads one over actors)."""

    def run(prompts: list[list[int]], offsets: list[float] | None, level: int, max_tokens: int) -> Awaitable[Sent]:
        return send(stream, prompts, max_tokens, level=level, offsets=offsets, on_send=on_send)

    return run


async def measure_level(
    stream: Stream | None,
    scenario: Scenario,
    level: int,
    *,
    prompts: list[list[int]],
    warmup: list[list[int]],
    model: str,
    model_weights: str,
    target: str,
    send: Send | None = None,
    on_send: OnSend | None = None,
) -> PerfResult:
    """Warm up (unrecorded, closed loop), then send `prompts` on the scenario's schedule at `level`
    (a sweep: several runs, actors/sweep.py), on `stream` in this process or through `send`
    (several client processes, actors/load_clients.py); `on_send(i)` as the i-th measured request is
    sent (in this process only: parity under load rides one client's event loop)."""
    from actors import sweep

    if send is not None and on_send is not None:
        msg = f"scenario {scenario.name!r}: parity under load needs the load sent from the engine's actor (clients: 1)"
        raise ValueError(msg)
    if send is None:
        assert stream is not None, "measure_level needs a stream or a send"
        send = local(stream)
    run = send
    measured_run = run if on_send is None or stream is None else local(stream, on_send=on_send)
    out = scenario.output_tokens
    warm = (await run(warmup, None, level, out)).timings
    if failed := [t.error for t in warm if t.error]:
        msg = f"scenario {scenario.name!r} level {level}: warm-up request failed: {failed[0]}"
        raise RuntimeError(msg)
    keys = {"model": model, "model_weights": model_weights, "target": target, "scenario": scenario.name, "level": level}
    if scenario.sweep is not None:
        return await sweep.search(measured_run, scenario, level, prompts=prompts, keys=keys)
    sent = await measured_run(prompts, scenario_schedule(scenario, len(prompts)), level, out)
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
    }
    requests = pa.Table.from_pylist(rows, schema=schema.PERF_REQUESTS) if rows else schema.PERF_REQUESTS.empty_table()
    return PerfResult(requests, pa.Table.from_pylist([level_row], schema=schema.PERF_LEVELS))
