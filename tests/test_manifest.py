"""Manifest validation: good input loads; each kind of bad input is one clear message, exit 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleet.contracts.errors import ManifestError
from fleet.run.manifest_file import load
from fleet.run.placement import actor_options
from fleet.run.plan import plan_shards

GOOD = textwrap.dedent(
    """
    models:
      - name: tiny
        source: {kind: synthetic, seed: 3}
    prompts:
      inline:
        - {id: a, prompt: "The capital of France is"}
        - {id: b, prompt: "Quantum computing is"}
      from-file: {file: prompts.jsonl}
    targets:
      - {name: ref, kind: hf, device: cpu, dtype: float32}
      - {name: cand, kind: vllm, device: cpu, dtype: bfloat16}
    reference: ref
    sampling: {max_tokens: 4, logprobs: 3}
    run: {shard_size: 2}
    """
)


def write(
    tmp_path: Path, text: str, jsonl: str | None = '{"id": "x", "prompt": "hi"}\n{"id": "y", "prompt": "yo"}\n'
) -> Path:
    if jsonl is not None:
        (tmp_path / "prompts.jsonl").write_text(jsonl)
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


def test_good_manifest_loads_and_plans(tmp_path: Path) -> None:
    m = load(write(tmp_path, GOOD))
    assert [p.id for p in m.prompt_list("from-file")] == ["x", "y"]
    assert m.target("cand").kind == "vllm"
    shards = plan_shards(m)
    # 1 model x 2 targets x (inline: 1 shard of 2, from-file: 1 shard of 2), reference first.
    assert [s.shard_id for s in shards] == [
        "tiny/ref/inline/00000",
        "tiny/ref/from-file/00000",
        "tiny/cand/inline/00000",
        "tiny/cand/from-file/00000",
    ]


def test_cpu_vllm_targets_get_cpu_engine_defaults(tmp_path: Path) -> None:
    m = load(write(tmp_path, GOOD))
    env = m.target("cand").actor_env()
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert actor_options(m.target("cand")) == {"num_cpus": 1.0}


def test_card_vllm_targets_keep_vllms_own_process_layout(tmp_path: Path) -> None:
    # On a card vLLM's engine core runs in a child process (its default); what only vLLM's CPU
    # build needs stays off. tests/test_accelerator_layout.py runs this layout on CPU engines.
    for device in ("npu", "cuda"):
        m = load(write(tmp_path, GOOD.replace("kind: vllm, device: cpu", f"kind: vllm, device: {device}")))
        assert m.target("cand").actor_env() == {}


def test_card_resources_per_device(tmp_path: Path) -> None:
    m = load(write(tmp_path, GOOD.replace("kind: vllm, device: cpu", "kind: vllm, device: npu")))
    assert actor_options(m.target("cand")) == {"num_cpus": 1.0, "resources": {"NPU": 1}}
    m = load(write(tmp_path, GOOD.replace("kind: vllm, device: cpu", "kind: vllm, device: cuda")))
    assert actor_options(m.target("cand")) == {"num_cpus": 1.0, "num_gpus": 1}


BAD = {
    "unknown key": (
        GOOD.replace("max_tokens: 4", "max_tokens: 4, max_tokenz: 5"),
        "sampling.max_tokenz",
        "unknown key",
    ),
    "wrong type": (GOOD.replace("max_tokens: 4", "max_tokens: lots"), "sampling.max_tokens", "integer"),
    "unknown dtype": (GOOD.replace("dtype: bfloat16", "dtype: fp8"), "targets[1].dtype", "float32"),
    "unknown kind": (GOOD.replace("kind: vllm", "kind: tensorrt"), "targets[1].kind", "known kinds: vllm, hf"),
    "reference names no target": (GOOD.replace("reference: ref", "reference: nope"), "reference 'nope'", "ref, cand"),
    "prompts file missing": (GOOD.replace("prompts.jsonl", "missing.jsonl"), "prompts", "missing.jsonl"),
    "duplicate prompt ids": (GOOD.replace("id: b,", "id: a,"), "prompts", "duplicate ids: a"),
    "model path not a model": (
        GOOD.replace("{kind: synthetic, seed: 3}", "{kind: path, path: .}"),
        "models[0].source.path",
        "not a model directory",
    ),
    "duplicate target names": (GOOD.replace("name: cand", "name: ref"), "targets", "duplicate names: ref"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_manifest_is_one_clear_error(tmp_path: Path, case: str) -> None:
    text, where, expected = BAD[case]
    path = write(tmp_path, text)
    with pytest.raises(ManifestError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message and where in message and expected in message, message


def test_bad_jsonl_line_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD, jsonl='{"id": "x", "prompt": "hi"}\n{"id": "y"}\n')
    with pytest.raises(ManifestError, match=r"prompts\.jsonl: row 2: expected a 'prompt' or 'messages' column"):
        load(path)


@pytest.mark.parametrize("case", ["unknown key", "prompts file missing", "model path not a model"])
def test_cli_exits_2_without_traceback_or_results(tmp_path: Path, case: str) -> None:
    text, where, _ = BAD[case]
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "fleet", "run", str(write(tmp_path, text)), "--results", str(results)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and where in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not results.exists()


def test_cli_missing_manifest_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fleet", "run", str(tmp_path / "nope.yaml")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "manifest file not found" in proc.stderr and "Traceback" not in proc.stderr


def test_dummy_weights_are_perf_only(tmp_path: Path) -> None:
    dummy = GOOD.replace("kind: vllm, device: cpu, dtype: bfloat16}", "kind: vllm, engine_args: {load_format: dummy}}")
    with pytest.raises(ManifestError, match="set parity: false"):
        load(write(tmp_path, dummy))
    m = load(write(tmp_path, dummy.replace("load_format: dummy}", "load_format: dummy}, parity: false")))
    assert {s.target for s in plan_shards(m)} == {"ref"}  # no parity shards for the perf-only target
