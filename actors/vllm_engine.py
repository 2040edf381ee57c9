"""The vLLM backend: an offline `vllm.LLM` engine on one card (CPU build here, NPU via vllm-ascend).

Latencies come from the engine's own request stats (`disable_log_stats=False`), all on the
engine-core monotonic clock, so TTFT and TPOT do not include Python-side batching overhead.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

from actors import reaper
from actors.tables import score_rows, scores_table, teacher_forced, to_generation, top_k
from actors.vllm_stream import StepBridge, request_stats
from actors.vllm_worker import RANK_FACTS, WORKER_EXTENSION
from fleet.contracts.backend_args import VllmArgs
from fleet.contracts.engine import Completion, Engine, Generation

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow as pa

    from actors.tables import Step
    from fleet.contracts.engine import PerfResult, Positions
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.scenario import Scenario
    from fleet.contracts.spec import Shard


class VllmEngine(Engine):
    def __init__(self, args: VllmArgs, *rest: Any, **kw: Any) -> None:
        super().__init__(args, *rest, **kw)
        self.args: VllmArgs = args
        self.sockets = reaper.sockets_dir()  # vLLM's IPC sockets, removed with the engine
        with reaper.removed_on_error(self.sockets):
            self.llm = self._start()
            self.tokenizer = self.llm.get_tokenizer()
            # The first request with logprobs pays one-off costs (~2 s); keep them out of the timings.
            self.llm.generate(["warm up"], self._params(max_tokens=2), use_tqdm=False)

    def _start(self) -> Any:
        from vllm import LLM

        args = self.args
        max_len = self.model.spec.max_model_len or args.max_model_len
        extra = {"max_model_len": max_len} if max_len else {}
        return LLM(
            model=str(self.model.path),
            tokenizer=self.tokenizer_path,
            trust_remote_code=self.model.spec.trust_remote_code,
            dtype=self.dtype,
            enforce_eager=args.enforce_eager,
            disable_log_stats=False,  # without it RequestOutput.metrics is None
            seed=self.sampling.seed,
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            # The executor is chosen from the placement (fleet/contracts/targets.py), never guessed
            # by vLLM; engine_args may still override it, like everything in this dict.
            **(
                {
                    "max_logprobs": max(20, self.sampling.logprobs),
                    "distributed_executor_backend": args.executor,
                    "worker_extension_cls": WORKER_EXTENSION,  # describe() asks every rank by name
                }
                | extra
                | args.engine_args
            ),
        )

    def _params(self, **overrides: Any) -> Any:
        from vllm import SamplingParams

        s = self.sampling
        kw = {"temperature": s.temperature, "max_tokens": s.max_tokens, "logprobs": s.logprobs, "seed": s.seed}
        # detokenize=False: vLLM would otherwise decode every top-k candidate of every step
        # (Logprob.decoded_token, never read here), ~15 % of throughput; the output is decoded
        # once per request below, the way the HF reference decodes it.
        return SamplingParams(**(kw | {"detokenize": False} | overrides))

    def _outputs(self, prompts: Sequence[Prompt], params: Any) -> list[Any]:
        """One RequestOutput per prompt, in the order given. Text prompts go through LLM.generate,
        chat prompts through LLM.chat so vLLM renders them its own way (a test checks that this
        gives the same token ids as the HF reference's rendering)."""
        text = [p for p in prompts if p.messages is None]
        chat = [p for p in prompts if p.messages is not None]
        outputs = self.llm.generate([p.prompt for p in text], params, use_tqdm=False) if text else []
        if chat:
            conversations = [[m.model_dump() for m in p.messages or []] for p in chat]
            outputs += self.llm.chat(conversations, params, use_tqdm=False)
        by_id = {p.id: out for p, out in zip(text + chat, outputs, strict=True)}
        return [by_id[p.id] for p in prompts]

    def generate(self, shard: Shard) -> Generation:
        started, t0 = time.time(), time.perf_counter()
        outputs = self._outputs(shard.prompts, self._params())
        wall = time.perf_counter() - t0
        completions = [self._completion(p, out) for p, out in zip(shard.prompts, outputs, strict=True)]
        return to_generation(shard, self.model, completions, started_at=started, wall_s=wall)

    def _completion(self, prompt: Prompt, out: Any) -> Completion:
        o = out.outputs[0]
        ids = list(o.token_ids)
        chosen = [step[tok] for tok, step in zip(ids, o.logprobs, strict=True)]
        tops = [top_k(_step(step), self.sampling.logprobs) for step in o.logprobs]
        m, stats = out.metrics, request_stats(out.metrics, len(ids))
        return Completion(
            prompt=prompt,
            rendered=out.prompt if out.prompt is not None else self.tokenizer.decode(out.prompt_token_ids),
            prompt_token_ids=list(out.prompt_token_ids),
            output_token_ids=ids,
            output_text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=o.finish_reason or "length",
            logprobs=[e.logprob for e in chosen],
            ranks=[e.rank for e in chosen],
            topk_ids=[top_ids for top_ids, _ in tops],
            topk_logprobs=[top_logprobs for _, top_logprobs in tops],
            queue_s=stats.queue_s,
            ttft_s=stats.ttft_s,
            tpot_s=stats.tpot_s,
            e2e_s=m.last_token_ts - m.queued_ts,
        )

    def score(self, requests: pa.Table, *, k: int, twin: str | None = None) -> pa.Table:
        """Teacher forcing through prompt_logprobs: prompt + output as one prompt, one token generated."""
        from vllm.inputs import TokensPrompt

        rows = teacher_forced(requests)
        prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"] + r["output_token_ids"]) for r in rows]
        params = self._params(max_tokens=1, logprobs=None, prompt_logprobs=k, temperature=0.0)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        out: list[dict[str, object]] = []
        for r, result in zip(rows, outputs, strict=True):
            n_prompt, n_out = len(r["prompt_token_ids"]), len(r["output_token_ids"])
            output_steps = result.prompt_logprobs[n_prompt : n_prompt + n_out]
            out += score_rows(r["prompt_id"], r["output_token_ids"], [_step(s) for s in output_steps], k=k)
        return scores_table(out)

    def probe_logits(self, prompts: list[Prompt], *, prompt_set: str, positions: Positions = "last") -> pa.Table:
        """fleet.contracts.probe_schema.PROBE_LOGITS from one engine call: `max_tokens=1, logprobs=-1` gives the full
        distribution after the last prompt token; "all" adds `prompt_logprobs=-1`, whose entry
        t + 1 is the distribution after prompt token t. Raw logprobs (before any sampling
        processor), float32. Needs an engine built with `max_logprobs=-1`: that reserves nothing
        (vLLM sizes logprob buffers per request, not at start-up), only these requests pay.
        Chat prompts are rendered by vLLM, as in generate."""
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
        out = []
        for prompt, result in zip(prompts, self._outputs(prompts, params), strict=True):
            ids = list(result.prompt_token_ids)
            last = probes.dense_logprobs(result.outputs[0].logprobs, 0, vocab)
            if positions == "all":
                before = [probes.dense_logprobs(result.prompt_logprobs, t + 1, vocab) for t in range(len(ids) - 1)]
                rows = probes.LogitsRows(prompt.id, ids, 0, np.stack([*before, last]))
            else:
                rows = probes.LogitsRows(prompt.id, ids, len(ids) - 1, last[None, :])
            out.append(rows)
        return probes.logits_table(probes.keys(self.model, self.args.name, prompt_set), out)

    def describe(self) -> dict[str, str]:
        import json

        from actors.provenance import describe

        # Asked of every rank, wherever the executor runs it: the threads its torch really uses,
        # and over several nodes (this actor then holds no card) the device facts, from rank 0's.
        spans = self.args.spans_nodes
        ranks = self.llm.collective_rpc(RANK_FACTS, args=(self.args.device, spans))
        info = ranks[0]["device"] if spans else describe(self.args.device)
        info |= {"rank_threads": json.dumps([r["torch_threads"] for r in ranks])}
        return info | ({"rank_hosts": json.dumps([r["hostname"] for r in ranks])} if spans else {})

    def shutdown(self) -> None:
        # Without an explicit shutdown the engine-core process outlives the actor (docs/platform.md).
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()
        reaper.remove(self.sockets)

    def perf(
        self,
        scenario: Scenario,
        level: int,
        prompts: Sequence[str | Prompt] | None = None,
        parity_prompts: Sequence[Prompt] | None = None,
    ) -> PerfResult:
        """Run one level of a perf scenario on this engine, streaming DELTA outputs (actors/loadgen.py).

        `prompts` are the scenario's prompt set when it names one; `parity_prompts` its `parity:`
        set, sent alone and mid-load with the run's sampling (actors/load_parity.py). The same
        in-process engine that generates and scores runs the load, through its own step loop
        (actors/vllm_stream.py): no second engine (~1.9 GB each, docs/platform.md).
        """
        import asyncio

        from actors.cache_stats import from_engine
        from actors.load_parity import run_level
        from actors.loadgen import prepare_level
        from actors.workloads import encode

        engine = self.llm.llm_engine
        max_len = engine.model_config.max_model_len
        prepared = prepare_level(self, scenario, level, prompts, tokenizer=self.tokenizer, max_model_len=max_len)
        bridge = StepBridge(engine)

        async def cache() -> tuple[int, int] | None:
            return from_engine(engine)

        async def complete(prompt: Prompt) -> Completion:
            # Rendered as the HF reference renders it (chat through the template), so that prompt
            # ids are the same alone and under load whatever the prompt.
            out = await bridge.complete(encode(self.tokenizer, prompt), self._params())
            return self._completion(prompt, out)

        def load(stream: Any) -> PerfResult:
            return asyncio.run(run_level(prepared, stream, cache=cache, prompts=parity_prompts, complete=complete))

        return bridge.run(load)


def _step(entries: dict[int, Any]) -> Step:
    """A step of vLLM `Logprob`s as {token id: (rank, logprob)}."""
    return {t: (e.rank, e.logprob) for t, e in entries.items()}
