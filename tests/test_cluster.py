"""Placement on a simulated multi-node cluster: 2 nodes x 8 `NPU` slots (ray.cluster_utils.Cluster,
the way Ray tests itself), engines on CPU. Run in a subprocess: a process holds one Ray.

Real HF engines (synthetic weights) take the one-card targets; a tensor-parallel target uses the
labelled test-double backend, since no CPU engine here spans cards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleet.contracts.errors import UserError
from fleet.run.manifest import load
from fleet.run.placement import check_fits, footprint

pytestmark = pytest.mark.engine

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from ray.cluster_utils import Cluster
    import ray
    from fleet.run import driver

    cluster = Cluster()
    for _ in range(2):
        cluster.add_node(num_cpus=4, resources={"NPU": 8})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    run_dir, outcome = driver.run(Path(sys.argv[1]), results_dir=Path(sys.argv[2]), run_id="sim", progress=False)
    print(json.dumps({"nodes": list(nodes), "failures": outcome.failures}))
    ray.shutdown()
    cluster.shutdown()
    """
)

MANIFEST = textwrap.dedent(
    """
    models:
    {models}
    prompts:
      p:
        - {{id: a, prompt: "The capital of France is"}}
        - {{id: b, prompt: "Quantum computing is"}}
    targets:
      - {{name: ref, kind: hf, dtype: float32, num_cpus: 0.25, resources: {{NPU: 1}}}}
      - {{name: bf16, kind: hf, dtype: bfloat16, num_cpus: 0.25, resources: {{NPU: 1}}}}
      - {{name: tp4, kind: test-double, device: npu, tensor_parallel_size: 4, num_cpus: 0.25}}
    reference: ref
    sampling: {{max_tokens: 4, logprobs: 3}}
    """
)


def manifest(tmp: Path, n_models: int) -> Path:
    models = "\n".join(f"  - {{name: m{i}, source: {{kind: synthetic, seed: {i}}}}}" for i in range(n_models))
    path = tmp / "m.yaml"
    path.write_text(MANIFEST.format(models=models))
    return path


def test_footprint_and_early_error(tmp_path: Path) -> None:
    m = load(manifest(tmp_path, 1))
    cluster = {"CPU": 8.0, "NPU": 16.0}
    assert footprint(m, cluster) == {"CPU": 0.75, "NPU": 6.0}  # 1 + 1 + 4 cards: all at once
    # 4 cards on one node only: a tp=4 target cannot be placed on 2 x 3 cards.
    with pytest.raises(RuntimeError, match=r"'tp4' needs .* on one node"):
        check_fits(m, {"CPU": 8.0, "NPU": 6.0}, [{"CPU": 4.0, "NPU": 3.0}, {"CPU": 4.0, "NPU": 3.0}])
    # Too few cards for the reference and the largest candidate together.
    with pytest.raises(RuntimeError, match="reference \\+ largest candidate"):
        check_fits(m, {"CPU": 8.0, "NPU": 4.0}, [{"CPU": 8.0, "NPU": 4.0}])


def test_cluster_too_small_is_a_clear_error_before_anything_is_written(tmp_path: Path) -> None:
    code = (
        "import sys, ray; from pathlib import Path; from fleet.run import driver;"
        "ray.init(address='local', num_cpus=2, resources={'NPU': 2}, include_dashboard=False);"
        "driver.run(Path(sys.argv[1]), results_dir=Path(sys.argv[2]), progress=False)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(manifest(tmp_path, 1)), str(tmp_path / "results")],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode != 0 and UserError.__name__ in proc.stderr
    assert "no node has that" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_two_nodes_of_eight_npus(tmp_path: Path) -> None:
    script = tmp_path / "sim.py"
    script.write_text(SCRIPT)
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(script), str(manifest(tmp_path, 4)), str(results)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["failures"] == {}
    info = json.loads((results / "sim" / "run.json").read_text())
    prov = info["provenance"]
    assert len(prov) == 4 * 3
    # Every actor landed on one of the two simulated nodes, and both nodes were used.
    used = {p["node_id"] for p in prov.values()}
    assert used <= set(summary["nodes"]) and len(used) == 2
    # One-card targets got one NPU id; the tp=4 engine got four, all from its own node.
    for key, p in prov.items():
        ids = json.loads(p["accelerator_ids"]).get("NPU", [])
        assert len(ids) == (4 if key.endswith("/tp4") else 1), (key, ids)
        assert key.endswith("/tp4") or p["visible_devices"] == ",".join(ids)
    # 4 models x 6 cards fit 16 cards only 2 at a time: the scheduler admits two, then reuses
    # their cards for the next two as each finishes.
    times = info["models"]
    admitted = sorted(t["admitted_at"] for t in times.values())
    first_finish = min(t["finished_at"] for t in times.values())
    assert admitted[1] < first_finish <= admitted[2]
