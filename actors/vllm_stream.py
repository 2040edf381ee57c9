"""Perf streaming for the in-process vLLM engine: a DELTA token stream without a second engine.

`StepBridge` drives the engine's own step loop (`add_request` / `step` / `abort_request`, as
`LLM.generate` does) in the actor's thread and hands each request's DELTA outputs to the load
generator's asyncio loop (actors/send_loop.py) in a helper thread. vLLM's `AsyncLLM` would give the
same stream but always starts a second engine-core process (~1.9 GB, docs/platform.md).
`request_stats` reads the engine's own latency figures from a finished request's metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable

    from fleet.contracts.engine import Chunk, EngineStats, PerfResult


class StepBridge:
    """Streams an in-process `LLMEngine` to an asyncio load generator running in a helper thread.

    The engine stays in the calling (actor) thread, stepping as vLLM's own `LLM.generate` does,
    so it keeps its OpenMP thread setup and needs no locking; the load generator's event loop
    runs beside it, free to send and stamp chunks while a step computes.
    """

    def __init__(self, engine: Any) -> None:
        import queue

        self.engine = engine
        self.commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.outputs: dict[str, tuple[Any, Any]] = {}  # request id -> (event loop, asyncio.Queue)
        self.ids = iter(range(1 << 62))
        self.failed: BaseException | None = None

    async def stream(
        self, prompt_token_ids: list[int], max_tokens: int, *, ignore_eos: bool = True, **as_sent: Any
    ) -> AsyncGenerator[Chunk, None]:
        """The engine's DELTA outputs for `prompt_token_ids` as Chunks. `as_sent` (the text or chat
        messages an HTTP target would get) is not needed: the ids are what they render to."""
        import asyncio

        from fleet.contracts.engine import Chunk

        rid = f"perf-{next(self.ids)}"
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.outputs[rid] = (asyncio.get_running_loop(), inbox)
        if self.failed is not None:  # checked after registering: see _fail
            raise self.failed
        self.commands.put(("add", (rid, prompt_token_ids, _delta(max_tokens, ignore_eos=ignore_eos))))
        finished = False
        try:
            while not finished:
                out = await inbox.get()
                if isinstance(out, BaseException):
                    raise out
                finished = out.finished
                n = len(out.outputs[0].token_ids)
                if finished:
                    yield Chunk(n, request_stats(out.metrics), len(out.prompt_token_ids or prompt_token_ids))
                else:
                    yield Chunk(n)
        finally:
            self.outputs.pop(rid, None)
            if not finished:
                self.commands.put(("abort", rid))

    async def complete(self, prompt_token_ids: list[int], params: Any) -> Any:
        """One request with `params` (vLLM SamplingParams, final output only) beside the load's
        streams: its finished RequestOutput (parity under load, actors/load_parity.py)."""
        import asyncio

        rid = f"parity-{next(self.ids)}"
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.outputs[rid] = (asyncio.get_running_loop(), inbox)
        if self.failed is not None:
            raise self.failed
        self.commands.put(("add", (rid, prompt_token_ids, params)))
        out = None
        try:
            while out is None or not out.finished:
                out = await inbox.get()
                if isinstance(out, BaseException):
                    raise out
            return out
        finally:
            self.outputs.pop(rid, None)
            if out is None or isinstance(out, BaseException) or not out.finished:
                self.commands.put(("abort", rid))

    def run(self, load: Callable[[Any], PerfResult]) -> PerfResult:
        """Run `load(self.stream)` in a helper thread while this thread steps the engine."""
        import threading

        result: list[PerfResult] = []
        error: list[BaseException] = []

        def generator() -> None:
            try:
                result.append(load(self.stream))
            except BaseException as e:  # noqa: BLE001  (re-raised in the engine's thread below)
                error.append(e)
            finally:
                self.commands.put(("done", None))

        thread = threading.Thread(target=generator, name="perf-load", daemon=True)
        thread.start()
        try:
            self._serve()
        except BaseException as e:
            self._fail(e)
            thread.join()
            raise
        thread.join()
        self._drain()
        if error:
            raise error[0]
        return result[0]

    def _serve(self) -> None:
        from vllm.inputs import TokensPrompt

        engine, live = self.engine, set[str]()
        done = False
        while not (done and not live):
            # Block only when the engine is idle; otherwise take what has arrived and step.
            batch = [self.commands.get()] if not live and not done else []
            while not self.commands.empty():
                batch.append(self.commands.get_nowait())
            for what, payload in batch:
                if what == "done":
                    done = True
                    live -= self._abort(live)  # requests the load generator left behind
                elif what == "abort":
                    live -= self._abort({payload} & live)
                else:
                    rid, ids, params = payload
                    try:
                        engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), params)
                        live.add(rid)
                    except Exception as e:  # noqa: BLE001  (a rejected request fails alone)
                        self._send(rid, e)
            if live:
                for out in engine.step():
                    self._send(out.request_id, out)
                    if out.finished:
                        live.discard(out.request_id)

    def _abort(self, rids: set[str]) -> set[str]:
        if rids:
            self.engine.abort_request(sorted(rids))
        return rids

    def _fail(self, error: BaseException) -> None:
        # Set first, then notify: a stream registering meanwhile either is in the snapshot or sees it.
        self.failed = error
        for rid in list(self.outputs):
            self._send(rid, error)

    def _send(self, rid: str, item: Any) -> None:
        if (target := self.outputs.get(rid)) is not None:
            loop, inbox = target
            loop.call_soon_threadsafe(inbox.put_nowait, item)

    def _drain(self) -> None:
        # Leave the engine as LLM.generate expects it: nothing queued, nothing running.
        while self.engine.has_unfinished_requests():
            self.engine.step()


def _delta(max_tokens: int, *, ignore_eos: bool = True) -> Any:
    """The load's sampling: greedy, `max_tokens` tokens (exactly, unless `ignore_eos` is off: a
    workload with free output lengths), streamed as DELTA outputs."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos, output_kind=RequestOutputKind.DELTA
    )


def request_stats(metrics: Any, n_tokens: int | None = None) -> EngineStats:
    """The engine's own queueing, TTFT and TPOT of one finished request from its `RequestStateStats`
    (engine monotonic clock), over `n_tokens` generated tokens (default: the engine's count)."""
    from fleet.contracts.engine import EngineStats

    m = metrics
    if m is None:  # the engine was built with disable_log_stats=True
        return EngineStats()
    n = m.num_generation_tokens if n_tokens is None else n_tokens
    return EngineStats(
        queue_s=m.scheduled_ts - m.queued_ts,
        ttft_s=m.first_token_ts - m.scheduled_ts,
        tpot_s=(m.last_token_ts - m.first_token_ts) / (n - 1) if n > 1 else None,
    )
