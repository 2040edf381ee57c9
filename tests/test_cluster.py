"""Placement on a simulated multi-node cluster: 2 nodes x 8 `NPU` slots (ray.cluster_utils.Cluster,
the way Ray tests itself), engines on CPU. Run in a subprocess: a process holds one Ray.

Every target is the labelled test-double backend: what is tested is where actors land, which card
ids they see and the reservation's hand-over to vLLM's Ray executor (which vLLM's CPU backend
cannot run: no Ray device), not the engines (six model loads were most of this file's time). Real
engines are placed on a real Ray in tests/test_engine_run.py, and real CPU tensor parallelism is
tested in tests/test_multicard.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from fleet.contracts.errors import UserError
from fleet.run.manifest_file import load
from fleet.run.placement import check_fits, reservation

pytestmark = pytest.mark.engine

MANIFEST = textwrap.dedent(
    """
    models:
    {models}
    prompts:
      p:
        - {{id: a, prompt: "The capital of France is"}}
        - {{id: b, prompt: "Quantum computing is"}}
    targets:
      - {{name: ref, kind: test-double, num_cpus: 0.25, resources: {{NPU: 1}}}}
      - {{name: bf16, kind: test-double, num_cpus: 0.25, resources: {{NPU: 1}}}}
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


def test_reservation_and_early_error(tmp_path: Path) -> None:
    m = load(manifest(tmp_path, 1))
    cluster = {"CPU": 8.0, "NPU": 16.0}
    assert reservation(m, cluster) == {"CPU": 0.75, "NPU": 6.0}  # 1 + 1 + 4 cards: all at once
    # 4 cards on one node only: a tp=4 target cannot be placed on 2 x 3 cards.
    with pytest.raises(RuntimeError, match=r"'tp4' needs .* on one node"):
        check_fits(m, {"CPU": 8.0, "NPU": 6.0}, [{"CPU": 4.0, "NPU": 3.0}, {"CPU": 4.0, "NPU": 3.0}])
    # Too few cards for the reference and tp4 together: they take turns, one target's cards at a time.
    check_fits(m, {"CPU": 8.0, "NPU": 4.0}, [{"CPU": 8.0, "NPU": 4.0}])
    assert reservation(m, {"CPU": 8.0, "NPU": 4.0}) == {"CPU": 0.25, "NPU": 4.0}
    # Too few for tp4 alone: that would wait forever.
    with pytest.raises(RuntimeError, match=r"target 'tp4' alone needs \{'NPU': 4.0\}; the cluster has \{'NPU': 3.0\}"):
        check_fits(m, {"CPU": 8.0, "NPU": 3.0})


def test_cluster_too_small_is_a_clear_error_before_anything_is_written(local_ray: object, tmp_path: Path) -> None:
    """On the session's Ray (2 CPUs, no NPU at all), a manifest of NPU targets: the user's error,
    naming what no node has, before the results directory is made."""
    from fleet.run import driver

    with pytest.raises(UserError, match="no node has that"):
        driver.run(manifest(tmp_path, 1), results_dir=tmp_path / "results", progress=False)
    assert not (tmp_path / "results").exists()


def test_two_nodes_of_eight_npus(cluster_runs: tuple[Path, list[str]]) -> None:
    results, lines = cluster_runs
    summary = json.loads(lines[0])
    assert summary["failures"] == {}
    info = json.loads((results / "sim" / "run.json").read_text())
    prov = info["provenance"]
    assert len(prov) == 3 * 3
    # Every actor landed on one of the two simulated nodes, and both nodes were used.
    used = {p["node_id"] for p in prov.values()}
    assert used <= set(summary["nodes"]) and len(used) == 2
    # One-card targets got one NPU id; the tp=4 engine got four, all from its own node.
    for key, p in prov.items():
        ids = json.loads(p["accelerator_ids"]).get("NPU", [])
        assert len(ids) == (4 if key.endswith("/tp4") else 1), (key, ids)
        assert key.endswith("/tp4") or p["visible_devices"] == ",".join(ids)
    # 3 models x 6 cards fit 16 cards only 2 at a time: the scheduler admits two, then reuses
    # their cards for the third once one finishes (a fourth model would only repeat that hand-over).
    times = info["models"]
    admitted = sorted(t["admitted_at"] for t in times.values())
    first_finish = min(t["finished_at"] for t in times.values())
    assert admitted[1] < first_finish <= admitted[2]


# A model on 2 nodes x 8 cards: tensor parallel 8 within each node, 2 pipeline stages across them.
PP_MANIFEST = textwrap.dedent(
    """
    models:
      - {name: big, source: {kind: synthetic, seed: 3}}
    prompts:
      p:
        - {id: a, prompt: "The capital of France is"}
    targets:
      - {name: ref, kind: test-double, num_cpus: 0.5}
      - {name: tp8pp2, kind: test-double, device: npu, tensor_parallel_size: 8, pipeline_parallel_size: 2,
         num_cpus: 0.5}
    reference: ref
    sampling: {max_tokens: 2, logprobs: 2}
    """
)

# One simulated cluster for both runs below (a process holds one Ray; the cluster's start is the
# cost): 2 nodes x 8 `NPU`. First the 3-model run, then the two-node engine's run and the hand-over.
#
# The hand-over: fleet reserves the group exactly as for a run (fleet.run.placement.reserve) and an
# actor placed as the engine's would be runs vLLM's own Ray-executor set-up on it
# (initialize_ray_cluster, then the rank -> bundle order its workers take). vLLM's CPU platform
# has no Ray device (empty ray_device_key), so the probe gives it vllm-ascend's, "NPU"; every
# check after that is vLLM's code as on an Atlas node.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from ray.cluster_utils import Cluster
    import ray
    from fleet.run import driver
    from fleet.run.manifest_file import load
    from fleet.run.placement import reserve

    cluster = Cluster()
    for _ in range(2):
        cluster.add_node(num_cpus=4, resources={"NPU": 8})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    sim_manifest, pp_manifest, results = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    _, sim = driver.run(sim_manifest, results_dir=results, run_id="sim", progress=False)
    print(json.dumps({"nodes": nodes, "failures": sim.failures}), flush=True)
    _, pp = driver.run(pp_manifest, results_dir=results, run_id="pp", progress=False)

    @ray.remote
    class VllmDriverProbe:
        def hand_over(self):
            from vllm.config import ParallelConfig
            from vllm.platforms import current_platform
            from vllm.v1.executor import ray_utils

            current_platform.ray_device_key = "NPU"
            config = ParallelConfig(
                tensor_parallel_size=8, pipeline_parallel_size=2, distributed_executor_backend="ray"
            )
            ray_utils.initialize_ray_cluster(config)
            ranks = ray_utils.get_bundles_sorted_by_node(config.placement_group)
            return {
                "pg": config.placement_group.id.hex(),
                "node": ray.get_runtime_context().get_node_id(),
                "rank_nodes": [node for _, node, _ in ranks],
                "rank_bundles": [b for b, _, _ in ranks],
            }

    target = load(pp_manifest).target("tp8pp2")
    pg, options = reserve(target)
    probe = VllmDriverProbe.options(**options).remote()
    seen = ray.get(probe.hand_over.remote(), timeout=300)
    seen["fleet_pg"] = pg.id.hex()
    print(json.dumps({"nodes": [n["NodeID"] for n in ray.nodes() if n["Alive"]], "failures": pp.failures,
                      "hand_over": seen}), flush=True)

    # Node loss: two nodes more, the only ones with `LOSS`. A candidate's shard hangs (its actor
    # writes its pid to a marker), and the node holding that actor goes. First the other node has
    # room; then the last `LOSS` node goes the same way, and a node joins only before --resume.
    import threading, time

    def node_of(pid):
        # The simulated node whose raylet started process `pid` (a raylet's workers are its
        # children): found in the process table, not through Ray's state API and its dashboard,
        # which another test's Ray on this machine may hold the port of.
        raylets = {n.all_processes["raylet"][0].process.pid: n for n in cluster.worker_nodes}
        while pid > 1 and pid not in raylets:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return raylets.get(pid)

    def lose_node(marker):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the marker may be half written
            if marker.exists() and marker.read_text():
                cluster.remove_node(node_of(int(marker.read_text())))
                return
            time.sleep(0.05)

    for _ in range(2):
        cluster.add_node(num_cpus=1, resources={"LOSS": 2})
    for run_id, manifest in zip(("room", "none"), sys.argv[4:6]):
        marker = Path(manifest).parent / run_id / "hang-m_cand_p_00001"
        killer = threading.Thread(target=lose_node, args=(marker,))
        killer.start()
        _, lost = driver.run(Path(manifest), results_dir=results, run_id=run_id, progress=False)
        killer.join()
        print(json.dumps({"loss": run_id, "retries": lost.retries, "failures": lost.failures}), flush=True)
    cluster.add_node(num_cpus=1, resources={"LOSS": 2})
    _, resumed = driver.resume(results / "none", progress=False)
    print(json.dumps({"loss": "resumed", "retries": resumed.retries, "failures": resumed.failures}), flush=True)
    ray.shutdown()
    cluster.shutdown()
    """
)


# Targets that only the node-loss nodes can hold; the candidate's second shard hangs until its node goes.
LOSS_MANIFEST = textwrap.dedent(
    """
    models:
      - {{name: m, source: {{kind: synthetic, seed: 5}}}}
    prompts:
      p:
        - {{id: a, prompt: "The capital of France is"}}
        - {{id: b, prompt: "Quantum computing is"}}
        - {{id: c, prompt: "Two plus two equals"}}
    targets:
      - {{name: ref, kind: test-double, num_cpus: 0.25, resources: {{LOSS: 1}}}}
      - {{name: cand, kind: test-double, num_cpus: 0.25, resources: {{LOSS: 1}}, fault_dir: {faults},
          hang_shards: [m/cand/p/00001]}}
    reference: ref
    sampling: {{max_tokens: 4, logprobs: 2}}
    run: {{shard_size: 1, start_timeout_s: {start}, shard_timeout_s: 120}}
    """
)


def loss_manifest(base: Path, run_id: str, *, start: float) -> Path:
    (base / run_id).mkdir()
    path = base / f"{run_id}.yaml"
    path.write_text(LOSS_MANIFEST.format(faults=base / run_id, start=start))
    return path


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The runs on the one simulated cluster: (results directory, the script's output lines: the
    3-model run's summary, the two-node engine's, then the node-loss runs')."""
    base = tmp_path_factory.mktemp("cluster")
    (base / "sim.py").write_text(SCRIPT)
    (base / "pp.yaml").write_text(PP_MANIFEST)
    results = base / "results"
    # In the second loss run a target that no live node can hold waits 4 s for one (half its start timeout).
    losses = [loss_manifest(base, "room", start=1800), loss_manifest(base, "none", start=8)]
    args = [manifest(base, 3), base / "pp.yaml", results, *losses]
    proc = subprocess.run(
        [sys.executable, str(base / "sim.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [line for line in proc.stdout.splitlines() if line.startswith('{"nodes"')]
    assert len(summaries) == 2, proc.stdout[-3000:]
    losses = [line for line in proc.stdout.splitlines() if line.startswith('{"loss"')]
    assert len(losses) == 3, proc.stdout[-3000:]
    assert "m/cand: no live node can hold it; waiting 4 s for one to join" in proc.stderr, proc.stderr[-3000:]
    assert "timeout: m/cand describe" not in proc.stderr  # it failed after the grace, not its start timeout
    return results, summaries + losses


def test_an_engine_over_two_nodes_gets_one_bundle_per_card_and_vllm_takes_them(
    cluster_runs: tuple[Path, list[str]],
) -> None:
    results, lines = cluster_runs
    summary = json.loads(lines[1])
    assert summary["failures"] == {}
    nodes = set(summary["nodes"])
    assert len(nodes) == 2
    # The reservation fleet made for the run: 16 one-card bundles, 8 on each node, the actor's
    # CPUs in the first, and the actor itself on that bundle's node holding no card of its own.
    p = json.loads((results / "pp" / "run.json").read_text())["provenance"]["big/tp8pp2"]
    pg = json.loads(p["placement_group"])
    assert pg["strategy"] == "PACK"
    assert [b.get("NPU") for b in pg["bundles"]] == [1.0] * 16
    assert pg["bundles"][0]["CPU"] == 0.5 and all("CPU" not in b for b in pg["bundles"][1:])
    assert {n: pg["bundle_nodes"].count(n) for n in nodes} == dict.fromkeys(nodes, 8)
    assert p["node_id"] == pg["bundle_nodes"][0]
    assert json.loads(p["accelerator_ids"]).get("NPU", []) == []
    # The hand-over: vLLM's Ray executor takes fleet's group (not one of its own) from inside the
    # actor, and orders its 16 ranks stage by stage: ranks 0-7 (stage 0's tensor-parallel group) on
    # the actor's node, ranks 8-15 on the other.
    seen = summary["hand_over"]
    assert seen["pg"] == seen["fleet_pg"]
    assert seen["rank_nodes"][:8] == [seen["node"]] * 8
    other = (nodes - {seen["node"]}).pop()
    assert seen["rank_nodes"][8:] == [other] * 8
    assert sorted(seen["rank_bundles"]) == list(range(16))


def test_a_lost_node_s_shards_rerun_elsewhere_or_fail_its_targets_and_resume(
    cluster_runs: tuple[Path, list[str]],
) -> None:
    results, lines = cluster_runs
    room, none, resumed = (json.loads(line) for line in lines[2:])
    # Another node had room: the lost node's calls were retried there, and the run completed.
    assert room["failures"] == {} and room["retries"] >= 1
    assert_exactly_once(results / "room")
    # None had: the candidate failed with why (not after run.start_timeout_s of waiting on nothing),
    # the run ended partial, and --resume, once a node joined, finished it exactly once, scoring
    # what the reference had not scored when its node went.
    assert "no live node can hold it any more" in none["failures"]["m/cand"], none
    assert "{'CPU': 0.25, 'LOSS': 1.0} on one node" in none["failures"]["m/cand"]
    assert resumed["failures"] == {}
    assert json.loads((results / "none" / "run.json").read_text())["status"] == "complete"
    assert_exactly_once(results / "none")


def assert_exactly_once(run_dir: Path) -> None:
    tokens = pl.read_parquet(run_dir / "tokens" / "**" / "*.parquet")
    assert tokens.group_by("target").agg(pl.col("prompt_id").n_unique()).sort("target").rows() == [
        ("cand", 3),
        ("ref", 3),
    ]
    assert tokens.select("target", "prompt_id", "position").is_duplicated().sum() == 0
    assert tokens.filter(pl.col("target") == "cand")["ref_logprob"].null_count() == 0  # every row scored


def test_multi_node_admission() -> None:
    """A 2-stage x 8-card target fits two 8-card nodes, not 16 cards in stages split over 3 nodes."""
    from fleet.contracts.backend_args import TestDoubleArgs
    from fleet.run.placement import footprint, places

    t = TestDoubleArgs(name="t", device="npu", tensor_parallel_size=8, pipeline_parallel_size=2, num_cpus=1)
    assert footprint(t) == {"CPU": 1.0, "NPU": 16.0}
    assert places(t, [{"CPU": 4.0, "NPU": 8.0}, {"CPU": 4.0, "NPU": 8.0}])
    assert not places(t, [{"CPU": 4.0, "NPU": 6.0}, {"CPU": 4.0, "NPU": 5.0}, {"CPU": 4.0, "NPU": 5.0}])
    assert not places(t, [{"CPU": 0.0, "NPU": 8.0}, {"CPU": 0.0, "NPU": 8.0}])  # nowhere for the actor
    assert places(t, [{"CPU": 0.0, "NPU": 8.0}, {"CPU": 0.0, "NPU": 8.0}, {"CPU": 1.0, "NPU": 1.0}]) is False
    assert places(t, [{"CPU": 1.0, "NPU": 16.0}])  # both stages on one 16-card node
