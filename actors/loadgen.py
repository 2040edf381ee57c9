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
import random
import statistics
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
        measured = synthetic_prompts(tokenizer, n=scenario.num_requests, length=length, seed=seed)
    else:
        if not prompts:
            msg = f"scenario {scenario.name!r} uses prompt set {scenario.prompt_set!r}: pass its prompts"
            raise ValueError(msg)
        encoded = [encode(tokenizer, p) for p in prompts]
        measured = [encoded[i % len(encoded)] for i in range(scenario.num_requests)]
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
) -> Callable[[Stream, OnSend | None], Coroutine[Any, Any, PerfResult]]:
    """Tokenize one level's prompts and check them against the context now, before anything is
    sent; return `measure(stream, on_send)`, which runs the level on the engine's stream (`measure_level`)."""
    measured, warmup = prompt_ids(scenario, tokenizer, prompts, level=level)
    if max_model_len:
        check_fits(scenario, measured + warmup, max_model_len)
    model, target = engine.model, engine.args.name

    def measure(stream: Stream, on_send: OnSend | None = None) -> Coroutine[Any, Any, PerfResult]:
        return measure_level(
            stream,
            scenario,
            level,
            prompts=measured,
            warmup=warmup,
            model=model.name,
            model_weights=model.weights,
            target=target,
            on_send=on_send,
        )

    return measure


def _now() -> float:
    """The load generator's clock (a function so tests can substitute a scripted one)."""
    return time.perf_counter()


@dataclass
class _Timing:
    index: int
    scheduled: float
    n_prompt: int
    sent: float | None = None
    ended: float | None = None
    first: float | None = None
    last: float | None = None
    n_out: int = 0
    n_chunks: int = 0
    itl: list[float] = field(default_factory=list)
    stats: EngineStats | None = None
    error: str | None = None


async def _one(stream: Stream, ids: list[int], max_tokens: int, t: _Timing) -> None:
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
    prompts: list[list[int]],
    max_tokens: int,
    *,
    level: int,
    rate: float | None,
    seed: int,
    burstiness: float = 1.0,
    on_send: OnSend | None = None,
) -> tuple[float, float, list[_Timing]]:
    """Send `prompts` with at most `level` in flight: (start on perf_counter, on the wall clock, timings)."""
    start, started_at = _now(), time.time()
    # Every slot remembers when it became free: in a closed loop that is when the next request is due.
    free_at: asyncio.Queue[float] = asyncio.Queue()
    for _ in range(level):
        free_at.put_nowait(start)
    timings: list[_Timing] = []
    tasks: list[asyncio.Task[None]] = []
    offsets = arrivals(len(prompts), rate, burstiness, seed) if rate is not None else []

    async def run(ids: list[int], t: _Timing) -> None:
        try:
            await _one(stream, ids, max_tokens, t)
        except Exception as e:  # noqa: BLE001  (a failed request is a row, not the end of the level)
            t.error = f"{type(e).__name__}: {e}"[:500]
        finally:
            t.ended = _now()
            free_at.put_nowait(t.ended)

    for i, ids in enumerate(prompts):
        due = start + offsets[i] if rate is not None else start
        if rate is not None:
            await asyncio.sleep(max(0.0, due - _now()))
        freed = await free_at.get()
        t = _Timing(index=i, scheduled=due if rate is not None else freed, n_prompt=len(ids))
        timings.append(t)
        tasks.append(asyncio.create_task(run(ids, t)))
        if on_send is not None:
            on_send(i)
    await asyncio.gather(*tasks)
    return start, started_at, timings


async def measure_level(
    stream: Stream,
    scenario: Scenario,
    level: int,
    *,
    prompts: list[list[int]],
    warmup: list[list[int]],
    model: str,
    model_weights: str,
    target: str,
    on_send: OnSend | None = None,
) -> PerfResult:
    """Warm up (unrecorded, closed loop), then send `prompts` on the scenario's schedule at `level`
    (`on_send(i)` as the i-th is sent)."""
    out = scenario.output_tokens
    *_, warm = await _schedule(stream, warmup, out, level=level, rate=None, seed=scenario.seed)
    if failed := [t.error for t in warm if t.error]:
        msg = f"scenario {scenario.name!r} level {level}: warm-up request failed: {failed[0]}"
        raise RuntimeError(msg)
    start, started_at, timings = await _schedule(
        stream,
        prompts,
        out,
        level=level,
        rate=scenario.request_rate,
        seed=scenario.seed,
        burstiness=scenario.burstiness,
        on_send=on_send,
    )
    wall = max((t.ended or start for t in timings), default=start) - start
    keys = {"model": model, "model_weights": model_weights, "target": target, "scenario": scenario.name, "level": level}
    return _tables(keys, scenario, start, started_at, wall, timings)


def _tables(
    keys: dict[str, Any], scenario: Scenario, start: float, started_at: float, wall: float, timings: list[_Timing]
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
                "n_prompt_tokens": t.n_prompt,
                "n_output_tokens": t.n_out,
                "n_chunks": t.n_chunks,
                "engine_queue_s": s.queue_s,
                "engine_ttft_s": s.ttft_s,
                "engine_tpot_s": s.tpot_s,
                "error": t.error,
            }
        )
    level_row = keys | {
        "request_rate": scenario.request_rate,
        "n_requests": len(timings),
        "n_errors": sum(t.error is not None for t in timings),
        "started_at": dt.datetime.fromtimestamp(started_at, tz=dt.UTC),
        "wall_s": wall,
        "hostname": socket.gethostname(),
    }
    requests = pa.Table.from_pylist(rows, schema=schema.PERF_REQUESTS) if rows else schema.PERF_REQUESTS.empty_table()
    return PerfResult(requests, pa.Table.from_pylist([level_row], schema=schema.PERF_LEVELS))
