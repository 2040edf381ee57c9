"""The scheduler's dispatch without Ray or engines: every kind of work, in order, with faults.

A fake `ray` module runs each actor call in-process when it is sent and hands results back one
at a time, in the order sent (a call told to be slow waits some rounds), so a run is
deterministic and takes a fraction of a second. The
actors answer like the test double (generate, score) plus small schema-conforming tables for the
capabilities the test double lacks (smoke, probes) and perf, so the targets here are real backend
kinds (hf, vllm, endpoint) that declare them. The fault tests in test_faults.py run the same
paths on a real Ray.
"""

from __future__ import annotations

import functools
import itertools
import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest

from actors.test_double import TestDoubleEngine
from fleet.contracts import schema, stored_tables
from fleet.contracts.backend_args import TestDoubleArgs
from fleet.contracts.engine import LoadRows, PerfResult, ResolvedModel
from fleet.contracts.perf_schema import LOAD_PHASES, LOAD_REQUESTS, LOAD_TOKENS
from fleet.contracts.spec import Shard
from fleet.results import reader
from fleet.run import driver

MANIFEST = """
models:
  - {name: m1, source: {kind: synthetic, seed: 1}}
  - {name: m2, source: {kind: synthetic, seed: 2}}
prompts:
  p:
    - {id: a, prompt: "one"}
    - {id: b, prompt: "two"}
    - {id: c, prompt: "three"}
targets:
  - {name: ref, kind: hf}
  - {name: vl, kind: vllm}
  - {name: ep, kind: endpoint, base_url: "http://127.0.0.1:9/v1"}
reference: ref
sampling: {max_tokens: 3, logprobs: 2}
run: {shard_size: 2, max_attempts: 2}
perf:
  - {name: s, concurrency: [1, 2], input_tokens: 4, output_tokens: 2, num_requests: 2}
probes:
  logits: {prompt_set: p}
  layers: {prompt_set: p}
"""
MODELS, SHARDS_PER_TARGET, LEVELS = 2, 2, 2
# Which actor calls happen, for one model: 3 targets x 2 shards, 2 candidates x 2 scored shards.
PERF_TARGETS, LOGITS_TARGETS, LAYERS_TARGETS, SMOKE_TARGETS = ("vl", "ep"), ("ref", "vl"), ("ref",), ("ep",)


def _zero(t: pa.DataType) -> Any:
    if pa.types.is_list(t):
        return []
    if pa.types.is_timestamp(t):
        return 0
    return {pa.string(): "", pa.bool_(): False}.get(t, 0)


def _row(table: str, **values: Any) -> pa.Table:
    """One row of `table`: the given values, zero for other required columns."""
    declared = stored_tables.all_tables()[table]
    columns = {f.name: values.get(f.name, _zero(f.type)) for f in declared if f.name in values or not f.nullable}
    return pa.table({name: pa.array([v], declared.field(name).type) for name, v in columns.items()})


@dataclass
class Cluster:
    """What the fake Ray knows: faults to inject, and what happened, in order."""

    fail: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (model, target, method) -> calls failing
    slow: dict[tuple[str, str, str], int] = field(default_factory=dict)  # -> ray.wait rounds its calls take
    failed_checks: set[tuple[str, str]] = field(default_factory=set)  # (model, target) whose smoke check fails
    log: list[tuple[str, ...]] = field(default_factory=list)  # ("send"|"got", model, target, method, detail)
    in_flight: list[tuple[str, ...]] = field(default_factory=list)
    overlaps: list[tuple[tuple[str, ...], ...]] = field(default_factory=list)  # a CPU perf level not alone
    actors: itertools.count[int] = field(default_factory=itertools.count)
    twins: list[str | None] = field(default_factory=list)  # the twin dtype each score call asked for
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 6.0})
    kill_at: tuple[str, str, str] | None = None  # (model, target, method) whose send kills the driver
    made: list[Actor] = field(default_factory=list)  # every actor started, in order
    # Each perf call as sent, with the actors then kept idle (shut down, not killed, not reused).
    idle_at_perf: list[tuple[tuple[str, ...], list[int]]] = field(default_factory=list)
    # Each perf call as sent, with the targets whose actors were then up (not idle, not killed).
    live_at_perf: list[tuple[tuple[str, ...], list[str]]] = field(default_factory=list)


class DriverKilled(BaseException):
    """The driver dies where it stands (as a SIGKILL would find it): nothing of ours catches it."""


class Ref:
    def __init__(self, cluster: Cluster, key: tuple[str, ...], run: Any) -> None:
        self.key = key
        self.rounds = cluster.slow.get(key[:3], 0)
        try:
            self.value, self.error = run(), None
        except Exception as e:  # noqa: BLE001  (handed back by ray.get, as Ray does)
            self.value, self.error = None, e


class Method:
    def __init__(self, actor: Actor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any, **kwargs: Any) -> Ref:
        actor, cluster = self.actor, self.actor.cluster
        if kwargs.get("build") is not None:  # a kept actor, handed to the next target of its shape
            actor.build(*kwargs.pop("build"))
        detail = _detail(self.name, args)
        # Logged, failed and slowed as the call it wraps: a generate_to is a generate, a score_stored a score.
        key = (actor.model.name, actor.target.name, WRAPS.get(self.name, self.name), detail)
        if self.name != "shutdown":
            busy = [k for k in cluster.in_flight if k[2] == "perf" or self.name == "perf"]
            if busy:
                cluster.overlaps.append((key, *busy))
            cluster.in_flight.append(key)
        cluster.log.append(("send", *key))
        if self.name == "shutdown":
            actor.idle = True
        if self.name == "perf":
            cluster.idle_at_perf.append((key, [a.id for a in cluster.made if a.idle and not a.dead]))
            cluster.live_at_perf.append((key, sorted(a.target.name for a in cluster.made if not (a.idle or a.dead))))
        if key[:3] == cluster.kill_at:
            raise DriverKilled(key)

        def run() -> Any:
            if actor.dead:
                msg = "ActorDiedError: the actor died"
                raise RuntimeError(msg)
            left = cluster.fail.get(key[:3], 0)
            if left:
                cluster.fail[key[:3]] = left - 1
                msg = f"ValueError: {self.name} told to fail"
                raise RuntimeError(msg)
            return getattr(actor, f"do_{self.name}")(*args, **kwargs)

        return Ref(cluster, key, run)


class Actor:
    def __init__(self, cluster: Cluster, target: Any, model: Any, sampling: Any) -> None:
        self.cluster, self.dead = cluster, False
        self.id = next(cluster.actors)
        cluster.made.append(self)
        self.build(target, model, sampling)

    def build(self, target: Any, model: Any, sampling: Any) -> None:
        self.target, self.model, self.idle = target, model, False
        resolved = ResolvedModel(model, Path(), f"w-{model.name}", None)
        self.engine = TestDoubleEngine(TestDoubleArgs(name=target.name), resolved, sampling=sampling)
        self.keys = {"model": model.name, "model_weights": resolved.weights, "target": target.name}

    def __getattr__(self, name: str) -> Method:
        if name.startswith("do_"):
            raise AttributeError(name)
        return Method(self, name)

    def do_describe(self, build: Any = None) -> dict[str, str]:
        return {"actor": str(self.id)}

    def do_smoke(self) -> pa.Table:
        passed = (self.model.name, self.target.name) not in self.cluster.failed_checks
        return _row("smoke", **self.keys, check="chat", passed=passed)

    def do_generate(self, shard: Any) -> Any:
        return self.engine.generate(shard)

    def do_score(self, requests: pa.Table, *, k: int, twin: str | None = None) -> pa.Table:
        self.cluster.twins.append(twin)  # the driver asks for the candidate's dtype
        return self.engine.score(requests, k=k, twin=twin)

    def do_generate_to(self, shard: Any, sink: Any) -> Any:  # as actors/target_actor.py
        return sink.generated(self.do_generate(shard))

    def do_score_stored(self, sink: Any, stored: Any, *, k: int, twin: str | None = None) -> Any:
        return sink.scored(stored, functools.partial(self.do_score, k=k, twin=twin))

    def do_perf(self, scenario: Any, level: int, prompts: Any, parity_prompts: Any = None) -> PerfResult:
        at = {**self.keys, "scenario": scenario.name, "level": level}
        parity = None
        if scenario.parity is not None:  # the test double's outputs, as if sent alone and mid-load
            shard = Shard(self.model.name, self.target.name, scenario.parity.prompt_set, level, tuple(parity_prompts))
            gen = self.engine.generate(shard)
            keyed = [pl.lit(scenario.name).alias("scenario"), pl.lit(level, pl.Int32).alias("level")]
            both = [
                pl.concat([frame.with_columns(phase=pl.lit(p)) for p in LOAD_PHASES])
                for frame in map(pl.from_arrow, (gen.requests, gen.tokens))
            ]  # type: ignore[arg-type]
            req, tok = (frame.with_columns(keyed).to_arrow() for frame in both)
            parity = LoadRows(schema.conform(req, LOAD_REQUESTS), schema.conform(tok, LOAD_TOKENS))
        return PerfResult(_row("perf_requests", **at), _row("perf_levels", **at), parity)

    def do_probe_logits(self, prompts: Any, *, prompt_set: str, positions: str) -> pa.Table:
        return _row("logits", **self.keys, prompt_set=prompt_set)

    def do_probe_layers(self, prompts: Any, *, prompt_set: str, positions: str) -> pa.Table:
        return _row("layers", **self.keys, prompt_set=prompt_set)

    def do_shutdown(self) -> None:
        return None


# The sink calls (fleet/results/direct.py, packed.py) and the calls they wrap.
WRAPS = {"generate_to": "generate", "score_stored": "score"}


def _detail(method: str, args: tuple[Any, ...]) -> str:
    if method == "score_stored":  # (sink, a Packed or a staged shard's (id, weights))
        return str(getattr(args[1], "shard_id", None) or args[1][0])
    if method in ("generate", "generate_to"):
        return str(args[0].shard_id)
    if method == "score" and "shard_id" not in args[0].column_names:  # a perf level's parity rows
        return f"{args[0].column('scenario')[0].as_py()}/{args[0].column('level')[0].as_py()}"
    if method == "score":
        return str(args[0].column("shard_id")[0].as_py())
    if method == "perf":
        return f"{args[0].name}/{args[1]}"
    return ""


def fake_ray(cluster: Cluster) -> dict[str, types.ModuleType]:
    ray = types.ModuleType("ray")

    class ActorClass:
        def options(self, **_: Any) -> ActorClass:
            return self

        def remote(self, target: Any, model: Any, sampling: Any) -> Actor:
            return Actor(cluster, target, model, sampling)

    def wait(refs: list[Ref], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Ref], list[Ref]]:
        ready = next((r for r in refs if r.rounds == 0), None)
        for r in refs:
            r.rounds = max(0, r.rounds - 1)
        return ([ready], [r for r in refs if r is not ready]) if ready else ([], refs)

    def get(ref: Ref, timeout: float | None = None) -> Any:
        cluster.log.append(("got", *ref.key))
        if ref.key in cluster.in_flight:
            cluster.in_flight.remove(ref.key)
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(actor: Actor, *, no_restart: bool = True) -> None:
        actor.dead = True

    resources = cluster.resources
    ray.is_initialized = lambda: True  # type: ignore[attr-defined]
    ray.get_runtime_context = lambda: types.SimpleNamespace(get_node_id=lambda: "n", get_job_id=lambda: "01")  # type: ignore[attr-defined]
    ray.cluster_resources = lambda: dict(resources)  # type: ignore[attr-defined]
    ray.nodes = lambda: [{"Alive": True, "Resources": resources, "NodeManagerHostname": "fake"}]  # type: ignore[attr-defined]
    ray.remote = lambda cls: ActorClass()  # type: ignore[attr-defined]
    ray.wait = wait  # type: ignore[attr-defined]
    ray.get = get  # type: ignore[attr-defined]
    ray.kill = kill  # type: ignore[attr-defined]
    util = types.ModuleType("ray.util")
    pg = types.ModuleType("ray.util.placement_group")
    # A placement group is logged with the actors alive when it is asked for: what holds resources.
    pg.placement_group = lambda *a, **k: cluster.log.append(
        ("placement_group", *(str(x.id) for x in cluster.made if not x.dead))
    )  # type: ignore[attr-defined]
    pg.remove_placement_group = lambda *a, **k: None  # type: ignore[attr-defined]
    strategies = types.ModuleType("ray.util.scheduling_strategies")
    strategies.PlacementGroupSchedulingStrategy = lambda *a, **k: None  # type: ignore[attr-defined]
    return {"ray": ray, "ray.util": util, "ray.util.placement_group": pg, "ray.util.scheduling_strategies": strategies}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    cluster = Cluster()
    for name, module in fake_ray(cluster).items():
        monkeypatch.setitem(sys.modules, name, module)
    return cluster


def run(tmp_path: Path, manifest: str = MANIFEST) -> tuple[Path, Any, dict[str, Any]]:
    path = tmp_path / "m.yaml"
    path.write_text(manifest)
    run_dir, outcome = driver.run(path, results_dir=tmp_path / "results", run_id="r", progress=False)
    assert isinstance(run_dir, Path)
    return run_dir, outcome, json.loads((run_dir / "run.json").read_text())


def tables(run_dir: Path) -> dict[str, pl.DataFrame]:
    return {name: frame.collect() for name, frame in reader.load(run_dir).items()}


def calls(cluster: Cluster, method: str, *, model: str = "m1") -> list[tuple[str, ...]]:
    return [e[2:] for e in cluster.log if e[0] == "send" and e[1] == model and e[3] == method]


def test_every_kind_of_work_runs_once_and_is_written(cluster: Cluster, tmp_path: Path) -> None:
    run_dir, outcome, info = run(tmp_path)
    assert info["status"] == "complete" and not outcome.partial and outcome.retries == 0
    assert set(info["provenance"]) == {f"{m}/{t}" for m in ("m1", "m2") for t in ("ref", "vl", "ep")}
    t = tables(run_dir)
    assert t["shards"].height == MODELS * 3 * SHARDS_PER_TARGET
    assert t["tokens"].filter(pl.col("target") != "ref")["ref_logprob"].null_count() == 0  # all scored
    assert t["perf_levels"].height == MODELS * len(PERF_TARGETS) * LEVELS
    assert sorted(t["logits"]["target"]) == sorted(LOGITS_TARGETS * MODELS)
    assert sorted(t["layers"]["target"]) == sorted(LAYERS_TARGETS * MODELS)
    assert sorted(t["smoke"]["target"]) == sorted(SMOKE_TARGETS * MODELS)
    # Each candidate shard is scored by the reference, once, with a precision twin at its dtype.
    assert cluster.twins and set(cluster.twins) == {"bfloat16"}
    scored = sorted(d for _, m, d in calls(cluster, "score"))
    assert scored == sorted(f"m1/{c}/p/{i:05d}" for c in ("vl", "ep") for i in range(SHARDS_PER_TARGET))
    assert {target for target, *_ in calls(cluster, "score")} == {"ref"}


def test_cpu_perf_levels_run_alone_after_their_targets_parity_work(cluster: Cluster, tmp_path: Path) -> None:
    run(tmp_path)
    assert cluster.overlaps == []
    for model in ("m1", "m2"):
        sent = [e[2:4] for e in cluster.log if e[0] == "send" and e[1] == model]
        for target in PERF_TARGETS:
            mine = [method for t, method in sent if t == target]
            first_perf = mine.index("perf")
            assert "generate" not in mine[first_perf:] and mine[first_perf:].count("perf") == LEVELS
        # The reference shuts down last: it scores every candidate shard first.
        downs = [t for t, method in sent if method == "shutdown"]
        assert downs[-1] == "ref" and sorted(downs) == ["ep", "ref", "vl"]


def test_failures_are_retried_then_recorded_and_the_rest_completes(cluster: Cluster, tmp_path: Path) -> None:
    cluster.fail = {
        ("m1", "vl", "perf"): 2,  # the first level fails both attempts
        ("m1", "vl", "probe_logits"): 1,
        ("m1", "ref", "score"): 2,  # the first scoring fails both attempts: written unscored
        ("m2", "ep", "generate"): 1,  # retried once, then fine
    }
    cluster.failed_checks = {("m2", "ep")}
    run_dir, _, info = run(tmp_path)
    assert info["status"] == "partial"
    assert info["retries"] == 4
    failed = info["failed_shards"]
    assert set(failed) == {"m1/vl/s/00001", "m1/vl/p/00000"}
    assert failed["m1/vl/p/00000"].startswith("unscored: ")
    assert info["failures"] == {"m2/ep": "smoke checks failed: chat"}
    t = tables(run_dir)
    assert t["shards"].height == MODELS * 3 * SHARDS_PER_TARGET  # nothing lost
    unscored = t["tokens"].filter(pl.col("ref_logprob").is_null() & (pl.col("target") != "ref"))
    assert sorted(set(unscored.select("model", "target", "prompt_id").rows())) == [("m1", "vl", "a"), ("m1", "vl", "b")]
    assert t["perf_levels"].height == MODELS * len(PERF_TARGETS) * LEVELS - 1
    assert cluster.overlaps == []


def test_a_reference_that_cannot_start_leaves_its_candidates_unscored(cluster: Cluster, tmp_path: Path) -> None:
    cluster.fail = {("m1", "ref", "describe"): 1}
    run_dir, _, info = run(tmp_path)
    assert set(info["failures"]) == {"m1/ref"}
    t = tables(run_dir)
    m1 = t["tokens"].filter(pl.col("model") == "m1")
    assert set(m1["target"]) == {"vl", "ep"} and m1["ref_logprob"].null_count() == m1.height
    assert set(info["failed_shards"]) == {
        "m1/ref/p/00000",
        "m1/ref/p/00001",
        "m1/ref/probe-logits",
        "m1/ref/probe-layers",
    }


def test_resume_runs_only_what_is_missing(cluster: Cluster, tmp_path: Path) -> None:
    cluster.fail = {("m1", "vl", "perf"): 2, ("m2", "ref", "probe_layers"): 2}
    run_dir, _, info = run(tmp_path)
    assert set(info["failed_shards"]) == {"m1/vl/s/00001", "m2/ref/probe-layers"}
    cluster.log.clear()
    _, outcome = driver.resume(run_dir, progress=False)
    assert not outcome.partial
    work = [e[1:5] for e in cluster.log if e[0] == "send" and e[3] not in ("describe", "smoke", "shutdown")]
    assert work == [("m1", "vl", "perf", "s/1"), ("m2", "ref", "probe_layers", "")]
    t = tables(run_dir)
    assert t["perf_levels"].height == MODELS * len(PERF_TARGETS) * LEVELS
    assert t["layers"].height == MODELS * len(LAYERS_TARGETS)


def test_a_target_whose_last_parity_call_fails_still_runs_its_perf_levels(cluster: Cluster, tmp_path: Path) -> None:
    cluster.fail = {("m1", "vl", "probe_logits"): 2}  # vl's last parity call, both attempts
    run_dir, _, info = run(tmp_path)
    assert info["failed_shards"] == {"m1/vl/probe-logits": "ValueError: probe_logits told to fail"}
    assert tables(run_dir)["perf_levels"].height == MODELS * len(PERF_TARGETS) * LEVELS
    assert cluster.overlaps == []


def test_the_reference_outlives_its_own_failed_call_while_candidates_generate(cluster: Cluster, tmp_path: Path) -> None:
    # The candidates are still generating when the reference runs out of work of its own.
    cluster.slow = {("m1", "vl", "generate"): 100, ("m1", "ep", "generate"): 100}
    cluster.fail = {("m1", "ref", "probe_layers"): 2}
    one_model = MANIFEST.replace("  - {name: m2, source: {kind: synthetic, seed: 2}}\n", "")  # no m2 perf to wait for
    run_dir, _, info = run(tmp_path, one_model)
    assert set(info["failed_shards"]) == {"m1/ref/probe-layers"}
    candidates = tables(run_dir)["tokens"].filter(pl.col("target") != "ref")
    assert candidates["ref_logprob"].null_count() == 0  # every candidate shard was scored
    assert sorted(d for _, m, d in calls(cluster, "score")) == sorted(
        f"m1/{c}/p/{i:05d}" for c in ("vl", "ep") for i in range(SHARDS_PER_TARGET)
    )


AFTER = """
models: [{name: m1, source: {kind: synthetic, seed: 1}}]
prompts: {p: [{id: a, prompt: "one"}, {id: b, prompt: "two"}, {id: c, prompt: "three"}]}
targets:
  - {name: ref, kind: hf}
  - {name: vl, kind: vllm}
  - {name: ep, kind: endpoint, base_url: "http://127.0.0.1:9/v1", after: vl}
reference: ref
sampling: {max_tokens: 3, logprobs: 2}
run: {shard_size: 2}
"""


@pytest.mark.parametrize("verdict", [None, "gates failed: seq_match_rate >= 1"])
def test_after_waits_for_the_gates_of_the_target_it_follows(
    cluster: Cluster, tmp_path: Path, verdict: str | None
) -> None:
    """Issue 19, 5d: `after:` used to wait only for the target to have finished without failing.
    Now its gates are asked once every row of it is scored and on disk, and a failing gate keeps
    its dependant from running."""
    asked: list[tuple[str, str, int]] = []

    def gates_of(run_dir: str | Path, model: str, target: str) -> str | None:
        tokens = reader.load(run_dir)["tokens"].collect().filter(pl.col("target") == target)
        asked.append((model, target, tokens["ref_logprob"].null_count()))
        assert set(tokens["prompt_id"]) == {"a", "b", "c"}  # both shards scored and written
        return verdict

    path = tmp_path / "m.yaml"
    path.write_text(AFTER)
    _, outcome = driver.run(path, results_dir=tmp_path / "r", run_id="r", progress=False, gates_of=gates_of)
    assert asked == [("m1", "vl", 0)]
    ep_calls = calls(cluster, "describe")
    if verdict is None:
        assert not outcome.failures and ("ep", "describe", "") in ep_calls
        # ep started only after the reference had scored vl's last shard.
        sends = [e for e in cluster.log if e[0] == "send"]
        last_score = max(i for i, e in enumerate(sends) if e[3] == "score" and e[4].startswith("m1/vl/"))
        assert sends.index(("send", "m1", "ep", "describe", "")) > last_score
        return
    assert outcome.failures["m1/ep"] == f"not run: vl did not pass ({verdict})"
    assert ("ep", "describe", "") not in ep_calls


def test_fleet_run_checks_the_followed_targets_gates(cluster: Cluster, tmp_path: Path) -> None:
    """Through the CLI: vl's gate cannot pass, so ep (after: vl) is not run, and the exit is 4."""
    from fleet import cli

    path = tmp_path / "m.yaml"
    path.write_text(AFTER + 'gates: [{metric: seq_match_rate, op: ">=", threshold: 2.0, targets: [vl]}]\n')
    code = cli.main(["run", str(path), "--results", str(tmp_path / "r"), "--run-id", "r", "--no-progress"])
    info = json.loads((tmp_path / "r" / "r" / "run.json").read_text())
    assert info["failures"]["m1/ep"].startswith("not run: vl did not pass (gates failed: seq_match_rate >= 2")
    assert code == cli.EXIT_GATES and info["gates"] == "FAIL"


def test_only_cpu_perf_levels_take_the_host_to_themselves() -> None:
    # A card's perf level times the card, which no other target shares: it runs beside the rest.
    from fleet.contracts.backend_args import VllmArgs
    from fleet.contracts.scenario import Scenario
    from fleet.run.perf_work import Perf
    from fleet.run.plan import PerfLevel
    from fleet.run.slots import ActorSlot

    level = Perf(
        level=PerfLevel(
            "m", "v", Scenario(name="s", concurrency=[1], input_tokens=8, output_tokens=4, num_requests=2), 1
        )
    )
    alone = {d: ActorSlot(VllmArgs(name="v", device=d), None, None).runs_alone(level) for d in ("cpu", "cuda", "npu")}  # type: ignore[arg-type]
    assert alone == {"cpu": True, "cuda": False, "npu": False}
