"""The vLLM backend: an offline `vllm.LLM` engine on one card (CPU build here, NPU via vllm-ascend).

Latencies come from the engine's own request stats (`disable_log_stats=False`), all on the
engine-core monotonic clock, so TTFT and TPOT do not include Python-side batching overhead.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

from actors.tables import scores_table, to_generation
from fleet.contracts.engine import Completion, Engine, Generation
from fleet.contracts.targets import VllmArgs

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Sequence

    import pyarrow as pa

    from fleet.contracts.engine import Chunk, EngineStats, PerfResult, Positions
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.spec import Scenario, Shard


class VllmEngine(Engine):
    def __init__(self, args: VllmArgs, *rest: Any, **kw: Any) -> None:
        super().__init__(args, *rest, **kw)
        from vllm import LLM

        self.args: VllmArgs = args
        max_len = self.model.spec.max_model_len or args.max_model_len
        extra = {"max_model_len": max_len} if max_len else {}
        self.llm = LLM(
            model=str(self.model.path),
            tokenizer=self.tokenizer_path,
            trust_remote_code=self.model.spec.trust_remote_code,
            dtype=self.dtype,
            enforce_eager=args.enforce_eager,
            disable_log_stats=False,  # without it RequestOutput.metrics is None
            seed=self.sampling.seed,
            # The actor holds all tp cards on one node; the engine spreads over them itself.
            tensor_parallel_size=args.tensor_parallel_size,
            **({"max_logprobs": max(20, self.sampling.logprobs)} | extra | args.engine_args),
        )
        self.tokenizer = self.llm.get_tokenizer()
        # The first request with logprobs pays one-off costs (~2 s); keep them out of the timings.
        self.llm.generate(["warm up"], self._params(max_tokens=2), use_tqdm=False)

    def _params(self, **overrides: Any) -> Any:
        from vllm import SamplingParams

        s = self.sampling
        kw = {"temperature": s.temperature, "max_tokens": s.max_tokens, "logprobs": s.logprobs, "seed": s.seed}
        # detokenize=False: vLLM would otherwise decode every top-k candidate of every step
        # (Logprob.decoded_token, never read here), ~15 % of throughput; the output is decoded
        # once per request below, the way the HF reference decodes it.
        return SamplingParams(**(kw | {"detokenize": False} | overrides))

    def generate(self, shard: Shard) -> Generation:
        # Chat prompts go through LLM.chat so vLLM renders them its own way: a test checks that
        # this gives the same token ids as the HF reference's rendering.
        text = [p for p in shard.prompts if p.messages is None]
        chat = [p for p in shard.prompts if p.messages is not None]
        started, t0 = time.time(), time.perf_counter()
        outputs = self.llm.generate([p.prompt for p in text], self._params(), use_tqdm=False) if text else []
        if chat:
            conversations = [[m.model_dump() for m in p.messages or []] for p in chat]
            outputs += self.llm.chat(conversations, self._params(), use_tqdm=False)
        wall = time.perf_counter() - t0
        by_id = {p.id: self._completion(p, out) for p, out in zip(text + chat, outputs, strict=True)}
        completions = [by_id[p.id] for p in shard.prompts]
        return to_generation(shard, self.model, completions, started_at=started, wall_s=wall)

    def _completion(self, prompt: Prompt, out: Any) -> Completion:
        k = self.sampling.logprobs
        o = out.outputs[0]
        ids = list(o.token_ids)
        chosen = [step[tok] for tok, step in zip(ids, o.logprobs, strict=True)]
        # Each step holds the top k plus the chosen token when it ranks below k: keep the top k.
        tops = [sorted((e.rank, t, e.logprob) for t, e in step.items() if e.rank <= k) for step in o.logprobs]
        m, n = out.metrics, len(ids)
        return Completion(
            prompt=prompt,
            rendered=out.prompt if out.prompt is not None else self.tokenizer.decode(out.prompt_token_ids),
            prompt_token_ids=list(out.prompt_token_ids),
            output_token_ids=ids,
            output_text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=o.finish_reason or "length",
            logprobs=[e.logprob for e in chosen],
            ranks=[e.rank for e in chosen],
            topk_ids=[[t for _, t, _ in top] for top in tops],
            topk_logprobs=[[lp for _, _, lp in top] for top in tops],
            queue_s=m.scheduled_ts - m.queued_ts,
            ttft_s=m.first_token_ts - m.scheduled_ts,
            tpot_s=(m.last_token_ts - m.first_token_ts) / (n - 1) if n > 1 else None,
            e2e_s=m.last_token_ts - m.queued_ts,
        )

    def score(self, requests: pa.Table, *, k: int) -> pa.Table:
        """Teacher forcing through prompt_logprobs: prompt + output as one prompt, one token generated."""
        from vllm.inputs import TokensPrompt

        columns = requests.select(["prompt_id", "prompt_token_ids", "output_token_ids"]).to_pylist()
        rows = [r for r in columns if r["output_token_ids"]]
        prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"] + r["output_token_ids"]) for r in rows]
        params = self._params(max_tokens=1, logprobs=None, prompt_logprobs=k, temperature=0.0)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        out: list[dict[str, object]] = []
        for r, result in zip(rows, outputs, strict=True):
            n_prompt = len(r["prompt_token_ids"])
            for j, tok in enumerate(r["output_token_ids"]):
                step = result.prompt_logprobs[n_prompt + j]
                top = sorted((e.rank, t, e.logprob) for t, e in step.items() if e.rank <= k)
                out.append(
                    {
                        "prompt_id": r["prompt_id"],
                        "position": j,
                        "ref_logprob": step[tok].logprob,
                        "ref_rank": step[tok].rank,
                        "ref_topk_ids": [t for _, t, _ in top],
                        "ref_topk_logprobs": [lp for _, _, lp in top],
                    }
                )
        return scores_table(out)

    def probe_logits(self, prompts: list[Prompt], *, prompt_set: str, positions: Positions = "last") -> pa.Table:
        """fleet.schema.PROBE_LOGITS from one engine call: `max_tokens=1, logprobs=-1` gives the full
        distribution after the last prompt token; "all" adds `prompt_logprobs=-1`, whose entry
        t + 1 is the distribution after prompt token t. Raw logprobs (before any sampling
        processor), float32. Needs an engine built with `max_logprobs=-1`: that reserves nothing
        (vLLM sizes logprob buffers per request, not at start-up), only these requests pay.
        Text prompts go through LLM.generate and chat prompts through LLM.chat, as in generate."""
        import numpy as np

        from actors import capture as probes

        config = self.llm.llm_engine.model_config
        if config.max_logprobs != -1:
            msg = (
                f"target {self.args.name!r}: the full-distribution probe needs a vLLM engine built with "
                f"max_logprobs=-1 (this one has {config.max_logprobs})"
            )
            raise ValueError(msg)
        vocab = config.get_vocab_size()
        # flat_logprobs: a few flat lists instead of vocab_size Logprob objects per position;
        # detokenize=False: no decoding of every vocabulary entry at every position.
        params = self._params(
            max_tokens=1,
            temperature=0.0,
            logprobs=-1,
            prompt_logprobs=-1 if positions == "all" else None,
            flat_logprobs=True,
            detokenize=False,
        )
        text = [p for p in prompts if p.messages is None]
        chat = [p for p in prompts if p.messages is not None]
        outputs = self.llm.generate([p.prompt for p in text], params, use_tqdm=False) if text else []
        if chat:
            conversations = [[m.model_dump() for m in p.messages or []] for p in chat]
            outputs += self.llm.chat(conversations, params, use_tqdm=False)
        by_id = {}
        for prompt, result in zip(text + chat, outputs, strict=True):
            ids = list(result.prompt_token_ids)
            last = probes.dense_logprobs(result.outputs[0].logprobs, 0, vocab)
            if positions == "all":
                before = [probes.dense_logprobs(result.prompt_logprobs, t + 1, vocab) for t in range(len(ids) - 1)]
                rows = probes.LogitsRows(prompt.id, ids, 0, np.stack([*before, last]))
            else:
                rows = probes.LogitsRows(prompt.id, ids, len(ids) - 1, last[None, :])
            by_id[prompt.id] = rows
        return probes.logits_table(probes.keys(self.model, self.args.name, prompt_set), [by_id[p.id] for p in prompts])

    def describe(self) -> dict[str, str]:
        from actors.provenance import describe

        return describe(self.args.device)

    def shutdown(self) -> None:
        # Without an explicit shutdown the engine-core process outlives the actor (docs/platform.md).
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()

    def perf(self, scenario: Scenario, level: int, prompts: Sequence[str | Prompt] | None = None) -> PerfResult:
        """Run one level of a perf scenario on this engine, streaming DELTA outputs (actors/perf.py).

        `prompts` are the scenario's prompt set when it names one. The same in-process engine that
        generates and scores runs the load: no second engine (~1.9 GB each, docs/platform.md).
        """
        import asyncio

        from actors import loadgen as perf

        engine = self.llm.llm_engine
        measured, warmup = perf.prompt_ids(scenario, self.llm.get_tokenizer(), prompts)
        perf.check_fits(scenario, measured + warmup, engine.model_config.max_model_len)
        bridge = _StepBridge(engine)
        return bridge.run(
            lambda stream: asyncio.run(
                perf.measure_level(
                    stream,
                    scenario,
                    level,
                    prompts=measured,
                    warmup=warmup,
                    model=self.model.name,
                    model_weights=self.model.weights,
                    target=self.args.name,
                )
            )
        )


class _StepBridge:
    """Streams an in-process `LLMEngine` to an asyncio load generator running in a helper thread.

    The engine stays in the calling (actor) thread, stepping as vLLM's own `LLM.generate` does,
    so it keeps its OpenMP thread setup and needs no locking; the load generator's event loop
    runs beside it, free to send and stamp chunks while a step computes. vLLM's `AsyncLLM`
    would give the same DELTA stream but always starts a second engine-core process.
    """

    def __init__(self, engine: Any) -> None:
        import queue

        self.engine = engine
        self.commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.outputs: dict[str, tuple[Any, Any]] = {}  # request id -> (event loop, asyncio.Queue)
        self.ids = iter(range(1 << 62))
        self.failed: BaseException | None = None

    async def stream(self, prompt_token_ids: list[int], max_tokens: int) -> AsyncGenerator[Chunk, None]:
        import asyncio

        from fleet.contracts.engine import Chunk

        rid = f"perf-{next(self.ids)}"
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.outputs[rid] = (asyncio.get_running_loop(), inbox)
        if self.failed is not None:  # checked after registering: see _fail
            raise self.failed
        self.commands.put(("add", (rid, prompt_token_ids, max_tokens)))
        finished = False
        try:
            while not finished:
                out = await inbox.get()
                if isinstance(out, BaseException):
                    raise out
                finished = out.finished
                n = len(out.outputs[0].token_ids)
                yield Chunk(n, _engine_stats(out) if finished else None)
        finally:
            self.outputs.pop(rid, None)
            if not finished:
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
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

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
                    rid, ids, max_tokens = payload
                    params = SamplingParams(
                        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA
                    )
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


def _engine_stats(out: Any) -> EngineStats:
    from fleet.contracts.engine import EngineStats

    m = out.metrics
    if m is None:  # the engine was built with disable_log_stats=True
        return EngineStats()
    n = m.num_generation_tokens
    return EngineStats(
        queue_s=m.scheduled_ts - m.queued_ts,
        ttft_s=m.first_token_ts - m.scheduled_ts,
        tpot_s=(m.last_token_ts - m.first_token_ts) / (n - 1) if n > 1 else None,
    )
