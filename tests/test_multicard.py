"""Engines over several ranks, and threads that match the reservation, with real engines.

One run on a private local Ray of 4 CPU slots (2 real cores: the slots are what the targets
reserve, the cores what they share), in a subprocess since a process holds one Ray:
- `vllm-tp2`: vLLM CPU float32 at tensor_parallel_size 2 (the multiprocessing executor inside the
  actor, one core per rank: VLLM_CPU_OMP_THREADS_BIND "0|1"), against the HF float32 reference:
  teacher-forced top-1 1.0 and max |dlogp| <= 1e-4, as for one rank.
- `vllm-2t` and the reference hold `num_cpus: 2`: their engines run with 2 threads (Ray alone
  would give them 1), as each engine process reports in run.json.
Tiny synthetic model, 3 prompts x 8 tokens: the TP engine's start (~34 s here) is the cost.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleet.analysis import parity as analysis
from fleet.results import reader

pytestmark = pytest.mark.engine

MANIFEST = textwrap.dedent(
    """
    models:
      - name: tiny
        source: {kind: synthetic, family: llama, seed: 11, hidden_size: 128, intermediate_size: 256,
                 num_layers: 2, num_heads: 4, num_kv_heads: 2, init_std: 0.1}
    prompts:
      p:
        - {id: a, prompt: "The capital of France is"}
        - {id: b, prompt: "Quantum computing is"}
        - {id: c, prompt: "Two plus two equals"}
    targets:
      - {name: hf-fp32, kind: hf, dtype: float32, num_cpus: 2}
      - {name: vllm-tp2, kind: vllm, dtype: float32, tensor_parallel_size: 2, num_cpus: 2, max_model_len: 128}
      - {name: vllm-2t, kind: vllm, dtype: float32, num_cpus: 2, max_model_len: 128}
    reference: hf-fp32
    sampling: {max_tokens: 8, logprobs: 3}
    """
)

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import ray
    from fleet.run import driver

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    run_dir, outcome = driver.run(Path(sys.argv[1]), results_dir=Path(sys.argv[2]), run_id="mc", progress=False)
    assert not outcome.failures, outcome.failures
    ray.shutdown()
    """
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, fleet_cache: Path) -> Path:
    base = tmp_path_factory.mktemp("multicard")
    (base / "m.yaml").write_text(MANIFEST)
    (base / "run.py").write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(base / "run.py"), str(base / "m.yaml"), str(base / "results")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return base / "results" / "mc"


def _threads(run_dir: Path) -> dict[str, dict[str, object]]:
    prov = json.loads((run_dir / "run.json").read_text())["provenance"]
    return {key.split("/")[1]: json.loads(p["threads"]) for key, p in prov.items()}


def test_tensor_parallel_2_matches_the_float32_reference(run_dir: Path) -> None:
    t = reader.load(run_dir)
    rows = {r["target"]: r for r in analysis.parity(t["requests"], t["tokens"], "hf-fp32").to_dicts()}
    tp2 = rows["vllm-tp2"]
    assert tp2["n_prompts"] == 3
    assert tp2["tf_top1_agreement"] == 1.0
    assert tp2["tf_max_abs_logprob_diff"] <= 1e-4
    assert rows["vllm-2t"]["tf_max_abs_logprob_diff"] <= 1e-4


def test_tensor_parallel_ranks_get_one_core_set_each(run_dir: Path) -> None:
    tp2 = _threads(run_dir)["vllm-tp2"]
    assert tp2["cpu_bind"] == "0|1"
    assert tp2["rank_threads"] == [1, 1]  # what torch reports inside each of the two rank processes


def test_num_cpus_2_gives_the_engine_2_threads(run_dir: Path) -> None:
    threads = _threads(run_dir)
    for name in ("vllm-2t", "hf-fp32"):
        assert threads[name]["OMP_NUM_THREADS"] == "2", (name, threads[name])
        assert threads[name]["torch_threads"] == 2, (name, threads[name])
    # The one-rank vLLM engine runs in the actor's process: its one rank reports 2 threads too.
    assert threads["vllm-2t"]["rank_threads"] == [2]
    assert threads["vllm-2t"]["cpu_bind"] == "nobind"
