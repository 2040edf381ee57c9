"""Threads from the reservation (actors/threads.py) and the executor each placement gets
(fleet/contracts/targets.py): pure functions, no engine."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from actors import threads
from fleet.contracts.backend_args import HFArgs, TestDoubleArgs, VllmArgs, VllmServerArgs
from fleet.run.placement import actor_options, bundles


def test_one_rank_is_not_bound_and_runs_num_cpus_threads() -> None:
    plan = threads.plan(VllmArgs(name="v", num_cpus=2), cores=[0, 1])
    assert plan == threads.Threads(threads=2, per_rank=2, cpu_bind="nobind")
    assert plan.env() == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert threads.plan(VllmArgs(name="v", num_cpus=0.5), cores=[0, 1]).threads == 1  # never 0


def test_tensor_parallel_ranks_get_disjoint_core_sets() -> None:
    plan = threads.plan(VllmArgs(name="v", tensor_parallel_size=2, num_cpus=2), cores=[0, 1])
    # MKL_NUM_THREADS at the rank's count too: torch prefers it to the OMP_NUM_THREADS vLLM sets per rank.
    assert plan.env() == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    plan = threads.plan(VllmArgs(name="v", tensor_parallel_size=2, num_cpus=4), cores=[3, 2, 1, 0, 7])
    assert (plan.cpu_bind, plan.per_rank) == ("0-1|2-3", 2)
    # The cores this process may run on, not core 0 upwards: a cgroup or taskset may narrow them.
    assert threads.plan(VllmArgs(name="v", tensor_parallel_size=2, num_cpus=2), cores=[4, 6]).cpu_bind == "4|6"
    with pytest.raises(RuntimeError, match="2 ranks need a core each"):
        threads.plan(VllmArgs(name="v", tensor_parallel_size=2, num_cpus=2), cores=[0])


def test_the_manifest_env_wins() -> None:
    target = VllmArgs(name="v", tensor_parallel_size=2, num_cpus=2, env={"VLLM_CPU_OMP_THREADS_BIND": "0-1|0-1"})
    assert threads.plan(target, cores=[0, 1]).cpu_bind == "0-1|0-1"
    env: dict[str, str] = {}
    threads.apply(TestDoubleArgs(name="t", num_cpus=2, env={"OMP_NUM_THREADS": "3"}), env=env)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("3", "2")


def test_accelerator_actors_set_host_threads_only() -> None:
    plan = threads.plan(VllmArgs(name="v", device="npu", tensor_parallel_size=8, num_cpus=8), cores=range(64))
    assert plan == threads.Threads(threads=8, per_rank=8, cpu_bind=None)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in plan.env()


def test_the_executor_follows_the_placement() -> None:
    assert VllmArgs(name="v").executor == "uni"
    assert VllmArgs(name="v", device="npu", tensor_parallel_size=8).executor == "mp"
    assert VllmArgs(name="v", device="npu", tensor_parallel_size=8, pipeline_parallel_size=2).executor == "ray"


def test_placements_vllm_cannot_run_are_refused() -> None:
    with pytest.raises(ValidationError, match="no cpu device"):
        VllmArgs(name="v", pipeline_parallel_size=2, num_cpus=2)
    with pytest.raises(ValidationError, match="num_cpus must be >= 2"):
        VllmArgs(name="v", tensor_parallel_size=2)
    with pytest.raises(ValidationError, match="vllm-server targets run on one node"):
        VllmServerArgs(name="s", device="npu", tensor_parallel_size=8, pipeline_parallel_size=2)
    with pytest.raises(ValidationError, match="hf targets run on one card"):
        HFArgs(name="h", device="npu", pipeline_parallel_size=2)


def test_bundles_one_per_card_over_nodes() -> None:
    one = VllmArgs(name="v", device="npu", tensor_parallel_size=8, num_cpus=4)
    assert bundles(one) == [{"CPU": 4.0, "NPU": 8.0}]
    assert actor_options(one) == {"num_cpus": 4, "resources": {"NPU": 8}}
    many = VllmArgs(
        name="v", device="cuda", tensor_parallel_size=2, pipeline_parallel_size=2, num_cpus=4,
        resources={"accelerator_type:H100": 0.001},
    )  # fmt: skip
    tag = {"accelerator_type:H100": 0.001}
    assert bundles(many) == [{"CPU": 4.0, "GPU": 1.0} | tag] + [{"GPU": 1.0} | tag] * 3
    assert actor_options(many) == {"num_cpus": 4, "resources": tag}  # the actor itself holds no card
