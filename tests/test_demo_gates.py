"""The demo's gates tell a healthy port from a broken one: the same gates (manifests/demo.yaml)
PASS on float32 vLLM and FAIL on a vLLM target whose model config is perturbed the way a port
goes wrong (a wrong RMSNorm epsilon, through vLLM's own `hf_overrides`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from fleet.analysis import gates
from fleet.report.model import RunReport

pytestmark = pytest.mark.engine

ROOT = Path(__file__).parents[1]
MANIFEST = textwrap.dedent(
    """
    models:
      - name: tiny-llama
        source: {kind: synthetic, family: llama, seed: 7, hidden_size: 128, intermediate_size: 256,
                 num_layers: 2, num_heads: 4, num_kv_heads: 2, init_std: 0.1}
    prompts:
      quiz: {builtin: arith-knowledge}
    targets:
      - {name: hf-fp32, kind: hf, device: cpu, dtype: float32}
      - {name: vllm-fp32, kind: vllm, device: cpu, dtype: float32, max_model_len: 256}
      - name: vllm-broken
        kind: vllm
        device: cpu
        dtype: float32
        max_model_len: 256
        engine_args: {hf_overrides: {rms_norm_eps: 0.5}}
    reference: hf-fp32
    sampling: {max_tokens: 12, logprobs: 5}
    run: {shard_size: 10}
    """
)


def test_demo_gates_pass_a_healthy_target_and_fail_a_broken_one(local_ray: object, tmp_path: Path) -> None:
    from fleet.run import driver

    demo_gates = gates.parse(yaml.safe_load((ROOT / "manifests" / "demo.yaml").read_text())["gates"])
    # Accuracy on a random tiny model is noise: keep the numerical gates, which are what a port breaks.
    numeric = [g for g in demo_gates if g.metric != "task_accuracy_delta"]
    path = tmp_path / "gates.yaml"
    path.write_text(MANIFEST)
    run_dir, outcome = driver.run(path, results_dir=tmp_path / "results", run_id="gates", progress=False)
    assert not outcome.failures, outcome.failures
    verdicts = RunReport.build(run_dir, gates=numeric).verdicts
    assert verdicts is not None
    by_target = {t: dict(zip(v["metric"], v["verdict"], strict=True)) for (t,), v in verdicts.group_by("target")}
    assert set(by_target["vllm-fp32"].values()) == {"PASS"}, by_target["vllm-fp32"]
    broken = by_target["vllm-broken"]
    assert broken["tf_p99_abs_logprob_diff"] == "FAIL" and "FAIL" in (broken["tf_top1_agreement"], broken["pearson_r"])
