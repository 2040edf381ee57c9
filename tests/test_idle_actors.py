"""Actors kept between targets (fleet/run/idle_actors.py), on test_scheduler's in-process Ray: the
next target of the same shape builds its engine in the last one's actor, a target of another shape
gets its own after the kept ones are killed, a kept actor that fails to build is replaced before
the target counts as failed, and nothing outlives the run, or the `across_runs()` block. The real
path, vLLM engines on a real Ray, is test_engine_run's (its bfloat16 candidate runs in the float32
one's process) and the test session's (tests/conftest.py `local_ray` keeps actors across runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest
from test_scheduler import Cluster, fake_ray, run, tables

from fleet.run.idle_actors import IdleActors, across_runs, keeping

MANIFEST = """
models:
  - {name: m1, source: {kind: synthetic, seed: 1}}
prompts:
  p: [{id: a, prompt: "one"}, {id: b, prompt: "two"}]
targets:
  - {name: ref, kind: hf}
  - {name: c1, kind: vllm}
  - {name: c2, kind: vllm, dtype: float32}
  - {name: c3, kind: vllm, env: {SOME_FLAG: "1"}}
  - {name: c4, kind: vllm}
reference: ref
sampling: {max_tokens: 3, logprobs: 2}
run: {shard_size: 2, max_attempts: 2}
"""


@pytest.fixture
def two_slots(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """test_scheduler's fake Ray with two CPU slots: the reference and one candidate at a time."""
    cluster = Cluster(resources={"CPU": 2.0})
    for name, module in fake_ray(cluster).items():
        monkeypatch.setitem(sys.modules, name, module)
    return cluster


def _actors(info: dict[str, object]) -> dict[str, str]:
    return {key.split("/")[1]: p["actor"] for key, p in info["provenance"].items()}  # type: ignore[attr-defined]


def test_targets_of_one_shape_share_an_actor_process(two_slots: Cluster, tmp_path: Path) -> None:
    run_dir, outcome, info = run(tmp_path, MANIFEST)
    assert info["status"] == "complete" and outcome.retries == 0
    actors = _actors(info)
    # c2 differs from c1 in its engine only: it is built in c1's process. c3's environment differs
    # (a process's, set when it starts): a new actor, and c1's kept one is killed to make room.
    # c4 is c1's shape again, and finds c3's process kept, which is not its shape: a new one.
    assert actors["c2"] == actors["c1"]
    assert len({actors["c1"], actors["c3"], actors["c4"], actors["ref"]}) == 4
    # Each target's rows are its own engine's: a rebuilt actor answers as the target it now is.
    t = tables(run_dir)
    assert sorted(set(t["tokens"]["target"])) == ["c1", "c2", "c3", "c4", "ref"]
    assert t["tokens"].filter(pl.col("target") != "ref")["ref_logprob"].null_count() == 0
    # Every actor is gone when the run ends, kept ones included; each engine was shut down first.
    sent = [e for e in two_slots.log if e[0] == "send"]
    assert sorted(target for _, _, target, method, _ in sent if method == "shutdown") == ["c1", "c2", "c3", "c4", "ref"]
    assert all(a.dead for a in two_slots.made)


def test_a_kept_actor_that_fails_to_build_is_replaced_before_the_target_fails(
    two_slots: Cluster, tmp_path: Path
) -> None:
    two_slots.fail = {("m1", "c2", "describe"): 1}  # its node went while the actor waited, say
    _, outcome, info = run(tmp_path, MANIFEST)
    assert info["status"] == "complete" and info["failures"] == {} and outcome.retries == 0
    actors = _actors(info)
    assert actors["c2"] != actors["c1"]  # built again in a new actor, where it started


def test_keep_actors_false_gives_every_target_its_own_process(two_slots: Cluster, tmp_path: Path) -> None:
    _, _, info = run(tmp_path, MANIFEST.replace("max_attempts: 2}", "max_attempts: 2, keep_actors: false}"))
    assert info["status"] == "complete"
    assert len(set(_actors(info).values())) == 5


def test_a_multi_card_target_starts_after_the_kept_actors_are_killed(two_slots: Cluster, tmp_path: Path) -> None:
    """Its placement group would wait for the slots a kept actor holds (seed 003's TP 2 variants
    after its TP 1 ones, on a 2-core host) until the start timeout failed it."""
    manifest = MANIFEST.replace(
        "{name: c2, kind: vllm, dtype: float32}", "{name: c2, kind: vllm, tensor_parallel_size: 2, num_cpus: 2}"
    )
    _, _, info = run(tmp_path, manifest)
    assert info["status"] == "complete"
    actors = _actors(info)
    [alive] = [entry[1:] for entry in two_slots.log if entry[0] == "placement_group"]
    assert actors["c1"] not in alive  # c1's kept actor was killed before c2's group was asked for


def test_across_runs_the_next_run_reuses_the_last_ones_actors(
    two_slots: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    two = MANIFEST.replace('  - {name: c3, kind: vllm, env: {SOME_FLAG: "1"}}\n', "")
    for name in "abcde":
        (tmp_path / name).mkdir()
    with across_runs() as pool:
        _, _, first = run(tmp_path / "a", two)
        kept = [a for a in two_slots.made if not a.dead]
        assert pool.kept and kept, "the block keeps the run's last actors alive"
        _, _, second = run(tmp_path / "b", two)
        assert _actors(second)["c1"] in {str(a.id) for a in kept}  # built in the first run's process
        assert _actors(second)["ref"] == _actors(first)["ref"]
        with across_runs() as inner:  # fleet calibrate's block, inside a test session's
            assert inner is pool
        assert pool.kept, "an inner block leaves the outer one's actors to it"
        # A run that keeps none first kills what earlier runs kept: it does not count their slots.
        run(tmp_path / "c", two.replace("max_attempts: 2}", "max_attempts: 2, keep_actors: false}"))
        assert not pool.kept and all(a.dead for a in kept)
        # Handles from a Ray since shut down are forgotten, not handed to a target.
        run(tmp_path / "d", two)
        before = len(two_slots.made)
        import ray

        monkeypatch.setattr(
            ray,
            "get_runtime_context",
            lambda: type("C", (), {"get_node_id": lambda s: "other", "get_job_id": lambda s: "01"})(),
        )
        _, outcome, fresh = run(tmp_path / "e", two)
        assert fresh["status"] == "complete" and outcome.retries == 0
        assert len(two_slots.made) > before and all(int(a) >= before for a in _actors(fresh).values())
    assert all(a.dead for a in two_slots.made if a.id >= before)  # the block's end kills what it kept


def test_a_run_outside_the_block_first_frees_the_slots_its_idle_actors_hold(two_slots: Cluster, tmp_path: Path) -> None:
    """A test session's pool holds idle actors while a module fixture's run, outside it, starts its
    own: they must not keep its actors from starting."""
    two = MANIFEST.replace('  - {name: c3, kind: vllm, env: {SOME_FLAG: "1"}}\n', "")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pool = IdleActors()
    with keeping(pool):
        run(tmp_path / "a", two)
    kept = [a for a in two_slots.made if not a.dead]
    assert kept and pool.kept
    _, _, info = run(tmp_path / "b", two)
    assert info["status"] == "complete"
    assert all(a.dead for a in kept) and not any(pool.kept.values())


def test_a_perf_level_with_client_actors_finds_no_actor_kept_idle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A level spread over client actors (Scenario.clients) needs CPUs beside its target's: the
    actors kept idle for later targets are killed before it is sent, not left holding them while
    the clients wait for READY_TIMEOUT_S. A level without client actors leaves them kept."""
    cluster = Cluster(resources={"CPU": 4.0})
    for name, module in fake_ray(cluster).items():
        monkeypatch.setitem(sys.modules, name, module)
    manifest = MANIFEST.replace("  - {name: c2, kind: vllm, dtype: float32}\n", "").replace(
        '  - {name: c3, kind: vllm, env: {SOME_FLAG: "1"}}\n  - {name: c4, kind: vllm}\n',
        '  - {name: ep, kind: endpoint, base_url: "http://127.0.0.1:9/v1"}\n',
    )
    perf = "perf:\n  - {name: spread, concurrency: [2], input_tokens: 4, output_tokens: 2, num_requests: 2, %s}\n"
    (tmp_path / "clients").mkdir()
    (tmp_path / "one").mkdir()
    _, _, info = run(tmp_path / "clients", manifest + perf % "clients: 2, targets: [ep]")
    assert info["status"] == "complete"
    [(sent, idle)] = [(key, idle) for key, idle in cluster.idle_at_perf if key[1] == "ep"]
    assert idle == [], f"{sent} was sent with kept actors {idle} holding CPUs"
    cluster.idle_at_perf.clear()
    _, _, info = run(tmp_path / "one", manifest + perf % "targets: [ep]")
    assert info["status"] == "complete"
    [(_, idle)] = [(key, idle) for key, idle in cluster.idle_at_perf if key[1] == "ep"]
    assert idle, "with one client the kept actors stay kept (this run's c1 is done by then)"


def test_a_models_client_actors_hold_cpus_no_other_model_takes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Admission counts a model's perf client actors: on a cluster with room for two models'
    targets but not for their clients too, the models run one after the other."""
    from test_scheduler import MANIFEST as TWO_MODELS

    from fleet.run.manifest_file import load
    from fleet.run.placement import add, footprint, reservation

    level = "  - {name: s, concurrency: [1, 2], input_tokens: 4, output_tokens: 2, num_requests: 2}\n"
    spread = level.replace("[1, 2]", "[2]").replace("}\n", ", clients: 2, targets: [ep]}\n")
    (tmp_path / "m.yaml").write_text(TWO_MODELS.replace(level, spread))
    manifest = load(tmp_path / "m.yaml")
    targets = add(*(footprint(t) for t in manifest.targets))
    room = {"CPU": 2 * targets["CPU"]}  # both models' targets at once, not their clients' 2 CPUs too
    assert reservation(manifest, room) == add(targets, {"CPU": 2.0})
    cluster = Cluster(resources=room)
    for name, module in fake_ray(cluster).items():
        monkeypatch.setitem(sys.modules, name, module)
    _, _, info = run(tmp_path, TWO_MODELS.replace(level, spread))
    assert info["status"] == "complete"
    sent = [entry[1] for entry in cluster.log if entry[0] == "send"]
    first, second = sent[0], next(m for m in sent if m != sent[0])
    assert max(i for i, m in enumerate(sent) if m == first) < sent.index(second), "the models overlapped"


def test_a_models_own_targets_leave_its_clients_cpus_free(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where a model's targets and a level's client actors do not all fit at once, its candidates
    run one at a time beside the reference, so that when the level is sent only its target and the
    reference hold CPUs: the clients' are free (a second candidate started into them left the
    clients waiting until they timed out)."""
    from fleet.run.manifest_file import load
    from fleet.run.placement import add, client_cpus, engines, footprint, reservation

    manifest = MANIFEST.replace("  - {name: c2, kind: vllm, dtype: float32}\n", "").replace(
        '  - {name: c3, kind: vllm, env: {SOME_FLAG: "1"}}\n  - {name: c4, kind: vllm}\n',
        '  - {name: ep, kind: endpoint, base_url: "http://127.0.0.1:9/v1"}\n',
    )
    manifest = manifest.replace("shard_size: 2", "shard_size: 1")  # c1 has work left when ep's level is ready
    manifest += (
        "perf:\n  - {name: spread, concurrency: [2], input_tokens: 4, output_tokens: 2, num_requests: 2, "
        "clients: 2, targets: [ep]}\n"
    )
    (tmp_path / "m.yaml").write_text(manifest)
    m = load(tmp_path / "m.yaml")
    targets = add(*(footprint(t) for t in m.targets))  # ref, c1 and ep: 3 CPUs
    room = {"CPU": targets["CPU"] + 1}  # all three targets, or the clients' 2 CPUs beside two of them
    reserved = reservation(m, room)
    assert add(engines(m, reserved), client_cpus(m)) == reserved == room
    cluster = Cluster(resources=room, slow={("m1", "c1", "generate"): 50})
    for name, module in fake_ray(cluster).items():
        monkeypatch.setitem(sys.modules, name, module)
    _, _, info = run(tmp_path, manifest)
    assert info["status"] == "complete"
    [(sent, live)] = [(key, live) for key, live in cluster.live_at_perf if key[1] == "ep"]
    assert live == ["ep", "ref"], f"{sent} was sent with {live} up: the clients' CPUs were taken"
