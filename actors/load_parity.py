"""Parity under load, on the engine's side: a perf level that also sends its scenario's parity
prompts (`parity:`, fleet/contracts/scenario.py) greedily with top-k logprobs, each alone on the
engine before the load ("solo": concurrency 1), then all at once when a share of the level's
measured requests has been sent ("load"), and returns their rows beside the level's.

It is engine-neutral, like the load generator (actors/loadgen.py): an engine hands it the level
as `prepare_level` built it, its `stream` and prefix-cache counters, and `complete(prompt) ->
Completion`, one greedy request with the run's sampling on the same engine and event loop as the
load. The parity requests come on top of the level's own: the load's requests in flight when each
is sent and when it completes are recorded (`in_flight_sent`, `in_flight_done`), so a reader sees
which batch it really shared.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from fleet.contracts.engine import Chunk, Completion, LoadRows, PerfResult

if TYPE_CHECKING:
    import pyarrow as pa

    from actors.loadgen import CacheCounters, PreparedLevel
    from actors.send_loop import Stream
    from fleet.contracts.engine import Engine
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.scenario import Scenario

Complete = Callable[["Prompt"], Awaitable[Completion]]


class _Counted:
    """The level's stream, counting the scenario's own requests in flight."""

    def __init__(self, stream: Stream) -> None:
        self._stream, self.in_flight = stream, 0

    async def stream(self, ids: list[int], max_tokens: int, **options: Any) -> AsyncGenerator[Chunk, None]:
        self.in_flight += 1
        try:
            async with contextlib.aclosing(self._stream(ids, max_tokens, **options)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self.in_flight -= 1


async def run_level(
    level: PreparedLevel,
    stream: Stream,
    *,
    cache: CacheCounters | None,
    prompts: Sequence[Prompt] | None,
    complete: Complete,
) -> PerfResult:
    """The level as `level.measure` runs it; with the scenario's `parity:` and its `prompts`, also
    its parity prompts alone, then mid-load (PerfResult.parity)."""
    scenario = level.scenario
    if scenario.parity is None or not prompts:
        return await level.measure(stream, cache=cache)
    solo = [await complete(p) for p in prompts]  # one at a time: nothing else on the engine
    counted = _Counted(stream)
    due = min(scenario.num_requests - 1, int(scenario.num_requests * scenario.parity.at))
    sent: list[asyncio.Task[list[tuple[Completion, int, int]]]] = []

    def on_send(index: int) -> None:
        if index == due:
            sent.append(asyncio.create_task(_under_load(counted, complete, prompts)))

    try:
        result = await level.measure(counted.stream, on_send=on_send, cache=cache)
        loaded = await sent[0]
    finally:
        for task in sent:
            task.cancel()
    flights = [(0, 0)] * len(solo) + [(a, b) for _, a, b in loaded]
    completions = [*solo, *(c for c, _, _ in loaded)]
    rows = _rows(level.engine, scenario, level.level, completions, flights, n_solo=len(solo))
    return PerfResult(result.requests, result.level, rows)


async def _under_load(
    counted: _Counted, complete: Complete, prompts: Sequence[Prompt]
) -> list[tuple[Completion, int, int]]:
    async def one(prompt: Prompt) -> tuple[Completion, int, int]:
        before = counted.in_flight
        done = await complete(prompt)
        return done, before, counted.in_flight

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def _rows(
    engine: Engine,
    scenario: Scenario,
    level: int,
    completions: list[Completion],
    flights: list[tuple[int, int]],
    *,
    n_solo: int,
) -> LoadRows:
    """perf_schema.LOAD_TABLES rows of the solo completions (the first `n_solo`) and the loaded ones, built as a
    parity shard's are (actors/tables.py) plus the level's keys."""
    import pyarrow as pa

    from actors.tables import to_generation
    from fleet.contracts import schema
    from fleet.contracts.perf_schema import LOAD_REQUESTS, LOAD_TOKENS
    from fleet.contracts.spec import Shard

    assert scenario.parity is not None
    shard = Shard(engine.model.name, engine.args.name, scenario.parity.prompt_set, level, ())
    gen = to_generation(shard, engine.model, completions, started_at=0.0, wall_s=0.0)
    phases = ["solo"] * n_solo + ["load"] * (len(completions) - n_solo)
    per_token = [p for c, p in zip(completions, phases, strict=True) for _ in c.output_token_ids]
    requests = _keyed(gen.requests, scenario.name, level, phases)
    requests = requests.append_column("in_flight_sent", pa.array([a for a, _ in flights], pa.int32()))
    requests = requests.append_column("in_flight_done", pa.array([b for _, b in flights], pa.int32()))
    tokens = _keyed(gen.tokens, scenario.name, level, per_token)
    return LoadRows(schema.conform(requests, LOAD_REQUESTS), schema.conform(tokens, LOAD_TOKENS))


def _keyed(table: pa.Table, scenario: str, level: int, phases: list[str]) -> pa.Table:
    import pyarrow as pa

    n = table.num_rows
    table = table.append_column("scenario", pa.array([scenario] * n, pa.string()))
    table = table.append_column("level", pa.array([level] * n, pa.int32()))
    return table.append_column("phase", pa.array(phases, pa.string()))
