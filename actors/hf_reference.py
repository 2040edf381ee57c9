"""The transformers backend: the trusted reference (float32 on CPU) and HF runs on any device.

Generation is a hand-written greedy loop over the KV cache rather than `model.generate`, so the
logprobs are the raw log-softmax of the very logits the token was chosen from, with per-step
timestamps, and nothing (repetition penalties, generation_config defaults) alters them unseen.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from actors.tables import scores_table, to_generation
from fleet.contracts.backend_args import HFArgs
from fleet.contracts.engine import Completion, Engine, Generation, Prefix

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow as pa

    from fleet.contracts.engine import Positions
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.spec import Shard


# Scoring keeps the KV cache of prompts longer than PREFIX_MIN tokens, up to PREFIX_TOKENS tokens in
# all, reference and twins together (SmolLM2-135M: 46 KB a token in float32; a 7B model with 8 KV
# heads: 256 KB).
PREFIX_MIN, PREFIX_TOKENS = 256, 16384


class HFEngine(Engine):
    def __init__(self, args: HFArgs, *rest: Any, **kw: Any) -> None:
        super().__init__(args, *rest, **kw)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        if args.device == "npu":
            import torch_npu  # noqa: F401  (registers the npu device with torch)
        self.args: HFArgs = args
        self.torch = torch
        self.device = torch.device("cpu" if args.device == "cpu" else f"{args.device}:0")
        trust = self.model.spec.trust_remote_code
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path, trust_remote_code=trust)
        self.net = AutoModelForCausalLM.from_pretrained(
            self.model.path,
            dtype=getattr(torch, self.dtype),
            attn_implementation=args.attn_implementation,
            trust_remote_code=trust,
        ).to(self.device)
        self.net.eval()
        self.twins: dict[str, Any] = {}  # dtype -> the precision twin (_twin)
        self.prefixes: dict[tuple[int, tuple[int, ...]], Any] = {}  # (net, prompt) -> KV cache, oldest first
        # Stop on the same ids vLLM stops on: the tokenizer's EOS and generation_config's.
        stops = {self.tokenizer.eos_token_id}
        try:
            eos = GenerationConfig.from_pretrained(self.model.path).eos_token_id
            stops |= set(eos) if isinstance(eos, list) else {eos}
        except OSError:
            pass
        self.stop_ids = {s for s in stops if s is not None}
        self.generator = torch.Generator(device="cpu").manual_seed(self.sampling.seed)

    def generate(self, shard: Shard) -> Generation:
        started, t0 = time.time(), time.perf_counter()
        completions = [self._complete(p) for p in shard.prompts]
        return to_generation(shard, self.model, completions, started_at=started, wall_s=time.perf_counter() - t0)

    def render(self, prompt: Prompt) -> tuple[str, list[int]]:
        """The text the model sees and its token ids: chat messages go through the chat template,
        whose output already holds any BOS, so it is tokenized without adding special tokens."""
        if prompt.messages is None:
            assert prompt.prompt is not None
            return prompt.prompt, list(self.tokenizer(prompt.prompt).input_ids)
        messages = [m.model_dump() for m in prompt.messages]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text, list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _complete(self, prompt: Prompt) -> Completion:
        torch, k, s = self.torch, self.sampling.logprobs, self.sampling
        rendered, prompt_ids = self.render(prompt)
        out: list[int] = []
        lps: list[float] = []
        ranks: list[int] = []
        top_ids: list[list[int]] = []
        top_lps: list[list[float]] = []
        stamps: list[float] = []
        finish = "length"
        t0 = time.perf_counter()
        with torch.inference_mode():
            step_input = torch.tensor([prompt_ids], device=self.device)
            past = None
            for _ in range(s.max_tokens):
                result = self.net(input_ids=step_input, past_key_values=past, use_cache=True)
                past = result.past_key_values
                logp = torch.log_softmax(result.logits[0, -1].float(), dim=-1)
                if s.temperature == 0:
                    token = int(torch.argmax(logp))
                else:
                    probs = torch.softmax(result.logits[0, -1].float() / s.temperature, dim=-1).cpu()
                    token = int(torch.multinomial(probs, 1, generator=self.generator))
                stamps.append(time.perf_counter())
                values, indices = torch.topk(logp, k)
                out.append(token)
                lps.append(float(logp[token]))
                ranks.append(int((logp > logp[token]).sum()) + 1)
                top_ids.append(indices.tolist())
                top_lps.append(values.tolist())
                if token in self.stop_ids:
                    finish = "stop"
                    break
                step_input = torch.tensor([[token]], device=self.device)
        n = len(out)
        return Completion(
            prompt=prompt,
            rendered=rendered,
            prompt_token_ids=prompt_ids,
            output_token_ids=out,
            output_text=self.tokenizer.decode(out, skip_special_tokens=True),
            finish_reason=finish,
            logprobs=lps,
            ranks=ranks,
            topk_ids=top_ids,
            topk_logprobs=top_lps,
            queue_s=0.0,  # one request at a time: nothing waits in a queue
            ttft_s=stamps[0] - t0,
            tpot_s=(stamps[-1] - stamps[0]) / (n - 1) if n > 1 else None,
            e2e_s=stamps[-1] - t0,
        )

    def score(self, requests: pa.Table, *, k: int, twin: str | None = None) -> pa.Table:
        """Teacher forcing: the log-softmax at every output position of each row, from one forward
        pass over prompt + output (short prompts batched, right-padded; long ones on their cached
        prefix, `_prefixed`). With `twin` (a dtype), the precision twin's pass gives `twin_logprob`."""
        torch = self.torch
        twin_net = self._twin(twin) if twin is not None else None
        rows = requests.select(["prompt_id", "prompt_token_ids", "output_token_ids"]).to_pylist()
        out: list[dict[str, object]] = []
        for start in range(0, len(rows), self.args.score_batch_size):
            batch = [r for r in rows[start : start + self.args.score_batch_size] if r["output_token_ids"]]
            short = [r for r in batch if len(r["prompt_token_ids"]) <= PREFIX_MIN]
            logps = dict(zip(map(id, short), self._padded(short), strict=True)) if short else {}
            for r in batch:
                logp = logps.pop(id(r)) if id(r) in logps else self._prefixed(self.net, r)
                target = torch.tensor(r["output_token_ids"], device=self.device)
                chosen = logp.gather(1, target[:, None])[:, 0]
                ranks = (logp > chosen[:, None]).sum(dim=1) + 1
                values, indices = torch.topk(logp, k, dim=-1)
                twin_chosen = (
                    self._prefixed(twin_net, r).gather(1, target[:, None])[:, 0].tolist()
                    if twin_net is not None
                    else [None] * len(target)
                )
                for j in range(len(target)):
                    out.append(
                        {
                            "prompt_id": r["prompt_id"],
                            "position": j,
                            "ref_logprob": float(chosen[j]),
                            "ref_rank": int(ranks[j]),
                            "ref_topk_ids": indices[j].tolist(),
                            "ref_topk_logprobs": values[j].tolist(),
                            "twin_logprob": twin_chosen[j],
                        }
                    )
        return scores_table(out)

    def _padded(self, batch: list[dict[str, Any]]) -> list[Any]:
        """One batched pass of the reference over right-padded rows: per row, the float32
        log-softmax at its output positions (logits at t predict token t+1)."""
        torch = self.torch
        seqs = [r["prompt_token_ids"] + r["output_token_ids"] for r in batch]
        width = max(map(len, seqs))
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=self.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=self.device)
        with torch.inference_mode():
            logits = self.net(input_ids=ids, attention_mask=mask).logits
        out = []
        for b, r in enumerate(batch):
            n_prompt, n_out = len(r["prompt_token_ids"]), len(r["output_token_ids"])
            out.append(torch.log_softmax(logits[b, n_prompt - 1 : n_prompt - 1 + n_out].float(), dim=-1))
        return out

    def _prefixed(self, net: Any, row: dict[str, Any]) -> Any:
        """The float32 log-softmax at one row's output positions, one unpadded sequence per pass
        (a padded batch would pay the longest prompt for every row, and eager attention holds a
        heads x length^2 matrix per sequence). Every candidate is scored on the same prompts, so a
        long prompt's KV cache is kept (the newest, up to PREFIX_TOKENS tokens) and only the output
        tokens run, on a copy of it: the prompt is computed the same way whichever candidate comes first."""
        import copy

        torch = self.torch
        prompt, out_ids = row["prompt_token_ids"], row["output_token_ids"]
        key = (id(net), tuple(prompt[:-1]))
        with torch.inference_mode():
            if len(prompt) > PREFIX_MIN and key not in self.prefixes:
                prefix = torch.tensor([prompt[:-1]], device=self.device)
                self.prefixes[key] = net(input_ids=prefix, use_cache=True).past_key_values
                while sum(len(k[1]) for k in self.prefixes) > PREFIX_TOKENS:
                    self.prefixes.pop(next(iter(self.prefixes)))
            if key in self.prefixes:
                ids = torch.tensor([prompt[-1:] + out_ids[:-1]], device=self.device)
                past = copy.deepcopy(self.prefixes[key])  # the forward pass extends it in place
                logits = net(input_ids=ids, past_key_values=past, use_cache=True).logits[0]
            else:
                ids = torch.tensor([prompt + out_ids], device=self.device)
                logits = net(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(out_ids)]
        return torch.log_softmax(logits.float(), dim=-1)

    def _twin(self, dtype: str) -> Any:
        """The precision twin for `dtype`: this reference's weights cast to it, run with the other
        attention kernel (eager <-> sdpa). A correct implementation at the candidate's precision that
        differs from the reference in operation order too, as any port does: at float32 the two
        kernels alone differ by ~1e-5 nats p99, at bfloat16 rounding gives ~0.13 (SmolLM2-135M,
        docs/platform.md). Built once per dtype, kept beside the reference."""
        if dtype not in self.twins:
            other = "eager" if self.args.attn_implementation == "sdpa" else "sdpa"
            from transformers import AutoModelForCausalLM

            net = AutoModelForCausalLM.from_pretrained(
                self.model.path,
                dtype=getattr(self.torch, dtype),
                attn_implementation=other,
                trust_remote_code=self.model.spec.trust_remote_code,
            ).to(self.device)
            self.twins[dtype] = net.eval()
        return self.twins[dtype]

    def probe_logits(self, prompts: list[Prompt], *, prompt_set: str, positions: Positions = "last") -> pa.Table:
        """fleet.contracts.probe_schema.PROBE_LOGITS: float32 log-softmax over the full vocabulary after the last
        prompt token ("last") or after every prompt token ("all"), one forward pass per prompt.
        Prompts are rendered as in generate (chat messages through the chat template)."""
        from actors import capture as probes

        torch, out = self.torch, []
        for prompt in prompts:
            _, ids = self.render(prompt)
            with torch.inference_mode():
                # logits_to_keep=1: the last position only, not [n, vocab] of logits to throw away.
                logits = self.net(
                    input_ids=torch.tensor([ids], device=self.device), logits_to_keep=1 if positions == "last" else 0
                ).logits[0]
                logp = torch.log_softmax(logits.float(), dim=-1).cpu().numpy()
            out.append(probes.LogitsRows(prompt.id, ids, len(ids) - len(logp), logp))
        return probes.logits_table(probes.keys(self.model, self.args.name, prompt_set), out)

    def probe_layers(
        self,
        prompts: Sequence[Prompt | Prefix],
        *,
        prompt_set: str,
        positions: Positions = "all",
        sublayers: bool = False,
        twin: str | None = None,
    ) -> pa.Table:
        """fleet.contracts.probe_schema.PROBE_LAYERS: hidden states of every prompt position ("all") or the
        last one, after each layer (actors/hf_layers.py); `sublayers` adds each decoder layer's
        attention and MLP outputs; `twin` (a dtype) probes the precision twin instead of this model.
        A `Prefix` is probed as the token ids it holds, a prompt as `render` gives it."""
        from actors import capture as probes
        from actors.hf_layers import capture

        net = self.net if twin is None else self._twin(twin)
        out = []
        for prompt in prompts:
            ids = list(prompt.token_ids) if isinstance(prompt, Prefix) else self.render(prompt)[1]
            layers, hidden = capture(net, ids, device=self.device, last_only=positions == "last", sublayers=sublayers)
            kept = list(range(len(ids)))[len(ids) - 1 :] if positions == "last" else list(range(len(ids)))
            out.append(probes.LayerRows(prompt.id, ids, kept, layers, hidden))
        return probes.layers_table(probes.keys(self.model, self.args.name, prompt_set), out)

    def describe(self) -> dict[str, str]:
        from actors.provenance import describe

        return describe(self.args.device)

    def shutdown(self) -> None:
        del self.net
