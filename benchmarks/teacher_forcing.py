"""Reference cost: teacher-forced scoring (HFEngine.score, one forward pass per sequence) vs HF
greedy generation (HFEngine.generate, one forward pass per token) of the same 128-token outputs,
float32 on CPU as the reference runs.

    .venv/bin/python benchmarks/teacher_forcing.py [--rounds 3] [--prompts 8] [--max-tokens 128]

Scoring reads the rows generation produced, so both handle exactly the same tokens.
"""

from __future__ import annotations

import argparse

import _common


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    opts = parser.parse_args()
    _common.setup_env()

    from actors.hf_reference import HFEngine
    from fleet.contracts.backend_args import HFArgs
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.spec import Sampling, Shard

    resolved, _ = _common.model()
    texts = _common.prompts(opts.prompts)
    shard = Shard("bench", "hf", "bench", 0, tuple(Prompt(id=str(i), prompt=t) for i, t in enumerate(texts)))
    engine = HFEngine(HFArgs(name="hf", dtype="float32"), resolved, sampling=Sampling(max_tokens=opts.max_tokens))
    requests = engine.generate(shard).requests  # also warms up
    n_tokens = int(sum(requests.column("n_output_tokens").to_pylist()))
    engine.score(requests, k=5)

    variants = {
        "HF greedy generation": lambda: _common.timed(
            lambda: sum(engine.generate(shard).requests.column("n_output_tokens").to_pylist())
        ),
        "teacher-forced scoring": lambda: _common.timed(lambda: engine.score(requests, k=5).num_rows),
    }
    rates = _common.alternate(variants, opts.rounds)
    _common.report(
        f"Teacher forcing vs generation ({opts.prompts} prompts x {n_tokens // opts.prompts} tokens, fp32, "
        f"score_batch_size {engine.args.score_batch_size})",
        rates,
        "tok/s",
    )
    r = _common.ratio(rates, "teacher-forced scoring", "HF greedy generation")
    print(f"  scoring the outputs costs {1 / r:.3f} of generating them ({r:.1f}x faster)")
    engine.shutdown()


if __name__ == "__main__":
    main()
