"""The load generator of the perf scenarios: one level of a scenario on an engine. It builds the
level's requests (actors/workloads.py) and checks them against the context before anything is
sent, warms up, sends the measured requests on the scenario's schedule (actors/arrivals.py, or a
trace's own times; a sweep: several runs, actors/sweep.py) through a `Send` (actors/send_loop.py,
in this process or over client actors), and turns the runs' timings into perf_requests and
perf_levels rows.

It is engine-neutral: an engine hands `measure_level` a `stream(prompt_token_ids, max_tokens)`
callable yielding `Chunk`s, plus keyword options only where a scenario needs them
(`Request.send_options`: free output, text or chat messages).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.arrivals import scenario_schedule
from actors.send_loop import OnSend, Send, Sent, Stream, local
from actors.workloads import Request, check_fits, fixed_output, level_requests, trace_offsets
from fleet.contracts.engine import EngineStats, PerfResult

if TYPE_CHECKING:
    from fleet.contracts.engine import Engine
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.scenario import Scenario


# The engine's prefix-cache counters (queries, hits) in tokens, or None where it reports none.
CacheCounters = Callable[[], Awaitable["tuple[int, int] | None"]]


@dataclass(frozen=True)
class PreparedLevel:
    """One level of a scenario on an engine, its requests built and checked (`prepare_level`):
    `measure` runs it (`measure_level`) under the engine's model and target."""

    engine: Engine
    scenario: Scenario
    level: int
    measured: Sequence[list[int] | Request]
    warmup: Sequence[list[int] | Request]

    def measure(
        self,
        stream: Stream | None,
        send: Send | None = None,
        on_send: OnSend | None = None,
        *,
        cache: CacheCounters | None = None,
    ) -> Coroutine[Any, Any, PerfResult]:
        model = self.engine.model
        return measure_level(
            stream,
            self.scenario,
            self.level,
            prompts=self.measured,
            warmup=self.warmup,
            model=model.name,
            model_weights=model.weights,
            target=self.engine.args.name,
            send=send,
            on_send=on_send,
            cache=cache,
        )


def prepare_level(
    engine: Engine,
    scenario: Scenario,
    level: int,
    prompts: Sequence[str | Prompt] | None,
    *,
    tokenizer: Any,
    max_model_len: int | None,
) -> PreparedLevel:
    """Tokenize one level's prompts and check them against the context now, before anything is sent."""
    measured, warmup = level_requests(scenario, tokenizer, prompts, level=level)
    if max_model_len:
        check_fits(scenario, measured + warmup, max_model_len)
    return PreparedLevel(engine, scenario, level, measured, warmup)


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

    from fleet.contracts import perf_schema

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
    requests = (
        pa.Table.from_pylist(rows, schema=perf_schema.PERF_REQUESTS)
        if rows
        else perf_schema.PERF_REQUESTS.empty_table()
    )
    return PerfResult(requests, pa.Table.from_pylist([level_row], schema=perf_schema.PERF_LEVELS))


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
