"""Harness overhead: output tokens/s through fleet-eval's VllmEngine.generate (top-5 logprobs and
the Arrow tables on) vs a bare `LLM.generate` loop with the same sampling on the same LLM.

    .venv/bin/python benchmarks/engine_overhead.py [--rounds 12] [--prompts 32] [--max-tokens 64] [--clock wall|cpu]

Target: ratio >= 0.97. Both variants run greedy with identical SamplingParams on one engine, so
they generate the same tokens; the difference is fleet-eval's own work (Completion objects,
top-k sorting, Arrow conversion).
"""

from __future__ import annotations

import _common


def main() -> None:
    bench = _common.vllm_bench(__doc__.splitlines()[0])
    opts, resolved, texts, shard, engine = bench.opts, bench.model, bench.texts, bench.shard, bench.engine

    from actors.tables import to_generation

    params = engine._params()  # exactly what generate() sends

    def fleet() -> int:
        return int(sum(engine.generate(shard).requests.column("n_output_tokens").to_pylist()))

    def bare() -> int:
        outs = engine.llm.generate(texts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    assert fleet() == bare()  # warm both paths; same greedy tokens either way
    rates = _common.alternate({"fleet VllmEngine.generate": lambda: _common.timed(fleet),
                               "bare LLM.generate": lambda: _common.timed(bare)}, opts.rounds)  # fmt: skip
    _common.report(
        f"Harness overhead ({opts.prompts} prompts x <= {opts.max_tokens} tokens, top-5 logprobs, bf16)",
        rates,
        "output tok/s",
    )
    r = _common.ratio(rates, "fleet VllmEngine.generate", "bare LLM.generate")
    print(f"  target >= 0.97: {'met' if r >= 0.97 else 'MISSED'}")

    # The end-to-end ratio carries the machine's noise; fleet's own work can also be timed alone,
    # on the outputs of one bare run: Completion objects, top-k sorting and the Arrow tables.
    outputs = engine.llm.generate(texts, params, use_tqdm=False)
    n_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)

    def post() -> int:
        completions = [engine._completion(p, out) for p, out in zip(shard.prompts, outputs, strict=True)]
        to_generation(shard, resolved, completions, started_at=0.0, wall_s=1.0)
        return n_tokens

    post_rate = max(_common.timed(post) for _ in range(opts.rounds))
    bare_rate = max(rates["bare LLM.generate"])
    print(f"  fleet's post-processing alone: {1000 * n_tokens / post_rate:.1f} ms per round "
          f"vs {1000 * n_tokens / bare_rate:.1f} ms of generation: implied ratio "
          f"{1 / (1 + bare_rate / post_rate):.3f}")  # fmt: skip
    engine.shutdown()


if __name__ == "__main__":
    main()
