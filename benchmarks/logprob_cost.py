"""Logprob capture cost: output tokens/s with top-5 logprobs and fleet-eval's Arrow conversion
(VllmEngine.generate) vs the same greedy generation without logprobs (bare LLM.generate).

    .venv/bin/python benchmarks/logprob_cost.py [--rounds 12] [--prompts 32] [--max-tokens 64] [--clock wall|cpu]

Target: cost <= 5 %, measured like for like: fleet-eval generates with `detokenize=False` and
decodes each output once, so the baseline does the same without logprobs (comparing with a
baseline that keeps vLLM's incremental detokenization would credit fleet-eval with the time it
saves there and understate the cost). Two more variants locate the cost: vLLM with logprobs=5 but
no Arrow (vLLM's share vs fleet-eval's conversion), with and without vLLM's detokenization of every
top-k candidate (`Logprob.decoded_token`, which fleet-eval never reads).
"""

from __future__ import annotations

import _common


def main() -> None:
    bench = _common.vllm_bench(__doc__.splitlines()[0])
    opts, texts, shard, engine = bench.opts, bench.texts, bench.shard, bench.engine

    def fleet() -> int:
        return int(sum(engine.generate(shard).requests.column("n_output_tokens").to_pylist()))

    tokenizer = engine.llm.get_tokenizer()

    def bare(logprobs: int | None, detokenize: bool = True) -> int:
        params = engine._params(logprobs=logprobs, detokenize=detokenize)
        outs = engine.llm.generate(texts, params, use_tqdm=False)
        if not detokenize:  # the text still has to come from somewhere: one decode per request
            [tokenizer.decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in outs]
        return sum(len(o.outputs[0].token_ids) for o in outs)

    # Warm all paths; every variant must give the same greedy tokens.
    assert fleet() == bare(None) == bare(None, False) == bare(5) == bare(5, False)
    baseline = "no logprobs, detokenize=False (vLLM)"
    variants = {
        "top-5 logprobs + Arrow (fleet)": lambda: _common.timed(fleet),
        "top-5, detokenize=False (vLLM)": lambda: _common.timed(lambda: bare(5, False)),
        "top-5, detokenized (vLLM)": lambda: _common.timed(lambda: bare(5)),
        baseline: lambda: _common.timed(lambda: bare(None, False)),
        "no logprobs, detokenized (vLLM)": lambda: _common.timed(lambda: bare(None)),
    }
    rates = _common.alternate(variants, opts.rounds)
    _common.report(
        f"Logprob capture cost ({opts.prompts} prompts x <= {opts.max_tokens} tokens, bf16)", rates, "output tok/s"
    )
    r = _common.ratio(rates, "top-5 logprobs + Arrow (fleet)", baseline)
    _common.ratio(rates, "top-5, detokenize=False (vLLM)", baseline)
    _common.ratio(rates, "top-5, detokenized (vLLM)", "no logprobs, detokenized (vLLM)")
    verdict = "met" if r >= 0.95 else "MISSED"
    print(f"  cost of top-5 logprobs + Arrow, like for like: {100 * (1 - r):.1f} % (target <= 5 %: {verdict})")
    engine.shutdown()


if __name__ == "__main__":
    main()
