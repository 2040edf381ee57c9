"""The client side of one run of a perf level: send a batch of requests with at most `level` in
flight, each when it is due (its arrival offset, or a free slot in a closed loop), and time each
one as the client sees it (`Timing`, gathered in `Sent`). actors/loadgen.py runs a level with it;
actors/load_clients.py runs it in several client actors at once.

An engine's `Stream` yields `Chunk`s (how many new tokens each carries, and at the end the
engine's own figures and its count of the prompt). Every chunk is stamped with time.perf_counter
as the client receives it. A chunk of k tokens counts as k tokens, each after gap/k: load testers
that count one token per chunk (or charge the whole gap to one token) overstate inter-token
latency whenever the server batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from actors.workloads import Request, as_request
from fleet.contracts.engine import Chunk, EngineStats

# stream(ids, max_tokens, **Request.send_options()): the options only where a scenario needs them.
Stream = Callable[..., AsyncGenerator[Chunk, None]]
# Called in the event loop as each measured request is sent, with its index: what else a level
# sends beside its load hooks in here (parity under load, actors/load_parity.py).
OnSend = Callable[[int], None]


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
