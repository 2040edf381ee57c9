"""Deep probes and the feature matrix through a whole run: real HF and vLLM engines.

The logits probe compares full-vocabulary distributions (vLLM float32 must equal the float32
reference to float32 noise, HF bfloat16 must not); the layer probe shows bfloat16's error growing
with depth; a matrix over one engine setting expands into variants whose greedy tokens agree.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from fleet.analysis import probes
from fleet.results import reader
from fleet.run import driver
from fleet.run.manifest_file import load

pytestmark = pytest.mark.engine

MANIFEST = textwrap.dedent(
    """
    models:
      - name: tiny
        source: {kind: synthetic, family: llama, seed: 7, hidden_size: 128, intermediate_size: 256,
                 num_layers: 4, num_heads: 4, num_kv_heads: 2, init_std: 0.1}
    prompts:
      two:
        - {id: a, prompt: "The capital of France is"}
        - {id: b, messages: [{role: user, content: "What is 2 plus 2?"}]}
    targets:
      - {name: hf-fp32, kind: hf, dtype: float32}
      - {name: hf-bf16, kind: hf, dtype: bfloat16}
      - name: vllm-fp32
        kind: vllm
        dtype: float32
        max_model_len: 256
        matrix: {engine_args.enable_prefix_caching: [true, false]}
    reference: hf-fp32
    sampling: {max_tokens: 8, logprobs: 5}
    probes:
      logits: {prompt_set: two, positions: all}
      layers: {prompt_set: two}
    gates:
      - {metric: logits_cosine_min, op: ">=", threshold: 0.999999, targets: [vllm-fp32.enable_prefix_caching-true]}
      - {metric: layer_cosine_min, op: ">", threshold: 0.99, targets: [hf-bf16]}
    """
)


@pytest.fixture(scope="module")
def probe_run(local_ray: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("probe-run")
    (base / "m.yaml").write_text(MANIFEST)
    run_dir, outcome = driver.run(base / "m.yaml", results_dir=base / "results", run_id="probe", progress=False)
    assert not outcome.partial, (outcome.failures, outcome.failed_shards)
    return Path(run_dir)


def test_matrix_expands_into_named_variants(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(MANIFEST)
    m = load(tmp_path / "m.yaml")
    names = [t.name for t in m.targets]
    assert names == [
        "hf-fp32",
        "hf-bf16",
        "vllm-fp32.enable_prefix_caching-true",
        "vllm-fp32.enable_prefix_caching-false",
    ]
    assert m.target(names[3]).engine_args["enable_prefix_caching"] is False  # type: ignore[attr-defined]
    assert m.variants[names[2]].base == "vllm-fp32"
    # The logits probe needs the full vocabulary from vLLM: the loader asks the engine for it.
    assert m.target(names[2]).engine_args["max_logprobs"] == -1  # type: ignore[attr-defined]


def test_full_distribution_probe(probe_run: Path) -> None:
    logits = reader.load(probe_run)["logits"].collect()
    assert set(logits["target"]) == {"hf-fp32", "hf-bf16", "vllm-fp32.enable_prefix_caching-true",
                                     "vllm-fp32.enable_prefix_caching-false"}  # fmt: skip
    assert (logits["logprobs"].list.len() == 512).all()  # full vocabulary, one list per row
    summary = {r["target"]: r for r in probes.logits_summary(probes.logits_errors(logits, "hf-fp32")).to_dicts()}
    fp32 = summary["vllm-fp32.enable_prefix_caching-true"]
    assert fp32["n_input_mismatch"] == 0 and fp32["logits_top1_agreement"] == 1.0
    assert fp32["logits_max_abs_err"] < 1e-4 and fp32["logits_kl_max"] < 1e-8
    bf16 = summary["hf-bf16"]
    assert bf16["logits_max_abs_err"] > 100 * fp32["logits_max_abs_err"] and bf16["logits_cosine_min"] > 0.99


def test_layer_probe_error_grows_with_depth(probe_run: Path) -> None:
    layers = reader.load(probe_run)["layers"].collect()
    curve = probes.layer_curve(probes.layer_errors(layers, "hf-fp32")).filter(pl.col("target") == "hf-bf16")
    assert curve["layer"].to_list() == list(range(6))  # embeddings, 4 decoder layers, final norm
    rel = curve["rel_l2"].to_list()
    assert rel[0] < rel[4] and all(r < 0.1 for r in rel)
    assert (curve["cosine"] > 0.99).all()


def test_report_shows_probes_matrix_and_gates(probe_run: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "fleet", "report", str(probe_run)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for section in ("## Full-distribution probe", "## Layer-wise probe", "## Feature matrix", "## Gates: PASS"):
        assert section in proc.stdout, section
    requests = reader.load(probe_run)["requests"].collect()
    a, b = (
        requests.filter(pl.col("target") == f"vllm-fp32.enable_prefix_caching-{v}").sort("prompt_id")[
            "output_token_ids"
        ]
        for v in ("true", "false")
    )
    assert a.to_list() == b.to_list()  # what the self-consistency table reports as identical
