"""`vllm-server` and `endpoint` targets against a real vLLM OpenAI server on 127.0.0.1.

One server for the module, hosted the way the scheduler hosts every target: a TargetActor on
the session's local Ray. One whole run (`served_run`) then takes both HTTP target kinds against one
HF float32 reference: an `endpoint` target against the module's server with a sentinel key (nothing
written, results, run.json, logs, may contain that key), and a `vllm-server` target the scheduler
starts and stops itself, with one perf level spread over two client actors. The two kinds used to
run one manifest each, each with its own reference.
The module's last test kills the module server's actor; the clean stop is the `served` target's.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from own_processes import own

from fleet.contracts.errors import UserError

pytestmark = pytest.mark.engine

SENTINEL = f"sk-fleet-sentinel-{secrets.token_hex(8)}"
# Ray workers inherit the environment of the session's first ray.init, which runs after test
# collection: setting the key at import is the only way an endpoint actor can read it without
# putting it in the manifest (which run.json records).
os.environ["FLEET_TEST_ENDPOINT_KEY"] = SENTINEL
MODEL = {
    "name": "tiny-llama",
    "source": {"kind": "synthetic", "family": "llama", "seed": 7, "hidden_size": 128, "intermediate_size": 256}
    | {"num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "init_std": 0.1},
}
PROMPTS = ["The capital of France is", "Quantum computing is", "Two plus two equals", "Write a short poem about"]


def server_args(**kw: Any) -> Any:
    from fleet.contracts.backend_args import VllmServerArgs

    return VllmServerArgs(**({"name": "srv-fp32", "dtype": "float32", "max_model_len": 256} | kw))


def start(ray: Any, args: Any) -> Any:
    """A TargetActor hosting the target, as fleet/run/slots.py starts one (but holding no CPU slot)."""
    from actors.target_actor import TargetActor
    from fleet.contracts.spec import ModelSpec, Sampling
    from fleet.run.slots import BASE_ENV

    runtime_env = {"env_vars": BASE_ENV | args.actor_env()}
    actor_class = ray.remote(TargetActor).options(num_cpus=0, runtime_env=runtime_env)
    return actor_class.remote(args, ModelSpec.model_validate(MODEL), Sampling(max_tokens=12, logprobs=5))


def engine_call(ray: Any, actor: Any, fn: Any) -> Any:
    return ray.get(actor.__ray_call__.remote(lambda self: fn(self.engine)), timeout=300)


def processes_with(marker: str, group: int | None = None) -> list[int]:
    """Live (non-zombie) processes whose command line contains `marker` (in process group `group`)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state, _, pgrp = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue
        if marker in cmdline and state != "Z" and group in (None, int(pgrp)) and own(proc.name):
            pids.append(int(proc.name))
    return sorted(pids)


@pytest.fixture(scope="module")
def server(local_ray: Any) -> Iterator[tuple[Any, dict[str, str]]]:
    # num_cpus 2: the server must run with 2 threads, not the 1 Ray gives the actor (no slot is
    # held here, see start(): the threads follow the target's num_cpus, not what Ray granted).
    actor = start(local_ray, server_args(api_key_env="FLEET_TEST_ENDPOINT_KEY", num_cpus=2))
    info = local_ray.get(actor.describe.remote(), timeout=600)
    yield actor, info
    local_ray.kill(actor)


SERVED_MANIFEST = """
models: [{model}]
prompts:
  four: {prompts}
targets:
  - {{name: hf-fp32, kind: hf, device: cpu, dtype: float32}}
  - {{name: endpoint, kind: endpoint, base_url: "{base_url}",
      api_key_env: FLEET_TEST_ENDPOINT_KEY, served_model: tiny-llama}}
  - {{name: served, kind: vllm-server, device: cpu, dtype: float32, max_model_len: 256}}
reference: hf-fp32
sampling: {{max_tokens: 12, logprobs: 5}}
perf:
  - {{name: s, concurrency: [2], input_tokens: 16, output_tokens: 8, num_requests: 4, warmup_requests: 1,
     targets: [served, endpoint], parity: {{prompt_set: four}}}}
  # Sent by two client actors (0 CPUs each: the session's 2 are the reference's and the target's).
  - {{name: spread, concurrency: [2], input_tokens: 16, output_tokens: 8, num_requests: 6, warmup_requests: 0,
     clients: 2, client_cpus: 0, targets: [endpoint]}}
"""


def other_api_servers(server: tuple[Any, dict[str, str]]) -> list[int]:
    """vLLM API server processes other than the module server's (which stays up for the module)."""
    marker = "vllm.entrypoints.openai.api_server"
    return sorted(set(processes_with(marker)) - set(processes_with(marker, int(server[1]["server_pgid"]))))


@pytest.fixture(scope="module")
def served_run(
    server: tuple[Any, dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, list[int]]:
    """One run of both HTTP target kinds: (manifest, run directory, the processes of the API servers
    other than the module's, and of the `served` target's process group, still alive once the run
    returned, waited for up to 10 s)."""
    from actors.server_group import members
    from fleet.run import driver

    base = tmp_path_factory.mktemp("served-run")
    manifest = base / "served.yaml"
    prompts = [{"id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)]
    manifest.write_text(SERVED_MANIFEST.format(model=MODEL, prompts=prompts, base_url=server[1]["base_url"]))
    run_dir, outcome = driver.run(manifest, results_dir=base / "results", run_id="served", progress=False)
    assert not outcome.failures and not outcome.partial, (outcome.failures, outcome.failed_shards)
    provenance = json.loads((Path(run_dir) / "run.json").read_text())["provenance"]
    [served] = [p for key, p in provenance.items() if key.split("/")[1] == "served"]
    # The supervisor, the API server and its engine core ran in the group; none may outlive the run.
    assert len(json.loads(served["server_threads"])) >= 2, served["server_threads"]
    for _ in range(50):
        left = other_api_servers(server) + sorted(members(int(served["server_pgid"])))
        if not left:
            break
        time.sleep(0.2)
    return manifest, Path(run_dir), left


def test_smoke_checks_pass_on_every_route(server: tuple[Any, dict[str, str]], local_ray: Any) -> None:
    rows = engine_call(local_ray, server[0], lambda e: e.smoke()).to_pylist()
    assert [(r["check"], r["passed"], r["status"]) for r in rows] == [
        ("models", True, 200),  # readiness: the served model is listed
        ("completions", True, 200),
        ("chat/completions", True, 200),
    ]
    assert '"data"' in rows[0]["response"]
    assert all('"choices"' in r["response"] for r in rows[1:]) and all(r["error"] is None for r in rows)


def test_the_server_processes_run_with_the_actors_threads(server: tuple[Any, dict[str, str]]) -> None:
    import json

    info = server[1]
    assert json.loads(info["threads"])["OMP_NUM_THREADS"] == "2"
    started_with = json.loads(info["server_threads"])  # each server process's own /proc environ
    assert started_with, info
    for env in started_with.values():
        assert env == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def test_generate_and_score_through_the_server(server: tuple[Any, dict[str, str]], local_ray: Any) -> None:
    from transformers import AutoTokenizer

    from fleet.contracts.prompts import Message, Prompt
    from fleet.contracts.spec import Shard

    actor, info = server
    prompts = (Prompt(id="t", prompt=PROMPTS[0]), Prompt(id="c", messages=[Message(role="user", content="hi")]))
    gen = local_ray.get(actor.generate.remote(Shard("tiny-llama", "srv-fp32", "p", 0, prompts)), timeout=120)
    requests, tokens = gen.requests.to_pylist(), gen.tokens.to_pylist()
    tok = AutoTokenizer.from_pretrained(info["model_dir"])
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert requests[0]["prompt_token_ids"] == tok(PROMPTS[0]).input_ids  # what the server used, as HF encodes it
    assert requests[1]["prompt_token_ids"] == tok(chat, add_special_tokens=False).input_ids
    assert all(r["queue_s"] is not None and r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"] for r in requests)
    assert len(tokens) == sum(r["n_output_tokens"] for r in requests)
    assert all(t["rank"] == 1 and t["topk_ids"][0] == t["token_id"] and len(t["topk_ids"]) == 5 for t in tokens)
    scores = local_ray.get(actor.score.remote(gen.requests, k=5), timeout=120).to_pylist()
    assert [(s["prompt_id"], s["position"]) for s in scores] == [(t["prompt_id"], t["position"]) for t in tokens]
    for s, t in zip(scores, tokens, strict=True):  # teacher forcing on its own greedy output
        assert s["ref_rank"] == 1 and s["ref_topk_ids"] == t["topk_ids"]
        assert abs(s["ref_logprob"] - t["logprob"]) < 1e-4


def test_perf_over_streaming_http(server: tuple[Any, dict[str, str]], local_ray: Any) -> None:
    from fleet.contracts.scenario import Scenario

    sc = Scenario(name="sse", concurrency=[3], input_tokens=20, output_tokens=10, num_requests=6, warmup_requests=2)
    result = engine_call(local_ray, server[0], lambda e: e.perf(sc, 3))
    rows = result.requests.to_pylist()
    assert len(rows) == 6 and all(r["error"] is None for r in rows)
    for r in rows:
        assert (r["n_prompt_tokens"], r["n_output_tokens"], len(r["itl_s"])) == (20, 10, 9)
        assert 1 <= r["n_chunks"] <= 10  # the server may merge tokens into one SSE event
        assert r["engine_ttft_s"] > 0 and r["engine_tpot_s"] > 0 and r["engine_queue_s"] >= 0
        assert sum(r["itl_s"]) == pytest.approx(r["tpot_s"] * 9)
    assert result.level.to_pylist()[0]["n_requests"] == 6


def test_exact_chat_lengths_and_prefix_cache_hits_from_the_server(
    server: tuple[Any, dict[str, str]], local_ray: Any
) -> None:
    """Chat messages built to an exact templated length, counted by the server itself (usage), and
    its /metrics prefix-cache counters: hits on a shared prefix spanning a 128-token CPU block."""
    from fleet.contracts.scenario import Scenario

    shared = {"groups": 2, "prefix_tokens": 136}
    sizes = {"input_tokens": 24, "output_tokens": 4, "num_requests": 8}
    sc = Scenario(name="prefix", concurrency=[2], **sizes, send="chat", shared_prefix=shared)
    result = engine_call(local_ray, server[0], lambda e: e.perf(sc, 2))
    rows = result.requests.to_pylist()
    assert all(r["error"] is None and r["n_output_tokens"] == 4 for r in rows)
    assert [r["n_prompt_tokens"] for r in rows] == [r["requested_prompt_tokens"] for r in rows] == [160] * 8
    [level] = result.level.to_pylist()
    assert level["prefix_cache_queries"] >= 8 * 160 and level["prefix_cache_hits"] >= 128


def test_endpoint_target_matches_the_reference_and_never_writes_its_key(
    server: tuple[Any, dict[str, str]], served_run: tuple[Path, Path, list[int]], tmp_path: Path
) -> None:
    from fleet.analysis import parity as analysis
    from fleet.results import reader
    from fleet.run import driver

    manifest, run_dir, _ = served_run
    # Every other field that could carry the key refuses it before anything is written, and says
    # so without repeating it (the scan below then finds it nowhere, these manifests deleted).
    text, url = manifest.read_text(), server[1]["base_url"]
    host = url.split("://", 1)[1]
    for bad, results in (
        (text.replace(url, f"http://user:{SENTINEL}@{host}"), tmp_path / "results"),
        (text.replace(url, f"{url}?api_key={SENTINEL}"), tmp_path / "results"),
        (text.replace("dtype: float32}", f"dtype: float32, env: {{HF_TOKEN: {SENTINEL}}}}}", 1), tmp_path / "results"),
        (text, f"s3://bucket/prefix?secret_key={SENTINEL}"),
    ):
        assert bad != text or isinstance(results, str)
        leaky = tmp_path / "leaky.yaml"
        leaky.write_text(bad)
        with pytest.raises(UserError) as refused:
            driver.run(leaky, results_dir=results, run_id="leak", progress=False)
        leaky.unlink()
        assert SENTINEL not in str(refused.value)
        assert not (tmp_path / "results" / "leak").exists()
    t = reader.load(run_dir)
    [row] = analysis.parity(t["requests"], t["tokens"], "hf-fp32").filter(pl.col("target") == "endpoint").to_dicts()
    assert row["n_prompts"] == 4 and row["tf_top1_agreement"] == 1.0 and row["tf_max_abs_logprob_diff"] < 1e-4
    # Everything written or logged: results, run.json, the Ray session's logs, the server's log.
    import ray

    session = Path(ray._private.worker._global_node.get_session_dir_path())
    files = [
        *tmp_path.rglob("*"),
        *run_dir.parent.parent.rglob("*"),
        *session.rglob("*"),
        Path(server[1]["server_log"]),
    ]
    leaked = [f for f in files if f.is_file() and SENTINEL.encode() in f.read_bytes()]
    assert leaked == []
    assert "base_url" in (run_dir / "run.json").read_text()  # the provenance is there, the key is not


def test_failed_starts_say_why_and_leave_nothing(fleet_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from actors import reaper
    from actors.sources import resolver
    from actors.vllm_server import VllmServerEngine, _free_port, log_dir
    from fleet.contracts.engine import ResolvedModel
    from fleet.contracts.spec import ModelSpec, Sampling

    spec = ModelSpec.model_validate(MODEL)
    model = ResolvedModel(spec, resolver(spec.source).local_dir(), "w", None)
    port = _free_port("127.0.0.1")
    monkeypatch.delenv(reaper.SOCKETS, raising=False)  # each engine sets it in this process: unset after
    with pytest.raises(RuntimeError, match=r"not ready after 1 s\n--- last \d+ lines of .*vllm-server-late") as late:
        VllmServerEngine(server_args(name="late", port=port, startup_timeout_s=1), model, sampling=Sampling())
    assert f"{log_dir()}/vllm-server-late-" in str(late.value)  # the log kept, where logs expire
    assert processes_with(f"--port {port}") == []
    assert not Path(os.environ[reaper.SOCKETS]).exists()  # nor its sockets directory
    broken = ResolvedModel(spec, fleet_cache / "no-such-model", "w", None)
    with pytest.raises(RuntimeError, match="exited before it was ready") as failed:
        VllmServerEngine(server_args(name="broken"), broken, sampling=Sampling())
    assert "no-such-model" in str(failed.value)  # the log tail shows vLLM's own complaint
    assert "vLLM server exited with code 1" in str(failed.value)
    assert not Path(os.environ[reaper.SOCKETS]).exists()


def test_server_logs_expire_after_a_week(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from actors.vllm_server import LOGS_KEPT_S, log_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    logs = log_dir()
    assert logs.parent == tmp_path and logs.stat().st_mode & 0o777 == 0o700
    old, recent, other = (logs / name for name in ("vllm-server-a-1.log", "vllm-server-b-2.log", "notes.txt"))
    for path in (old, recent, other):
        path.write_text("x")
    past = time.time() - LOGS_KEPT_S - 60
    for path in (old, other):
        os.utime(path, (past, past))
    assert log_dir() == logs  # the next server's start
    assert not old.exists() and recent.exists() and other.exists()  # only server logs are removed


def test_vllm_server_target_through_the_scheduler(served_run: tuple[Path, Path, list[int]]) -> None:
    """A whole run with a served target: smoke checks, parity over HTTP, a perf scenario over
    streaming HTTP, and the server gone afterwards (the run in `served_run`)."""
    from fleet.analysis import parity as analysis
    from fleet.results import reader

    _, run_dir, servers_left = served_run
    t = {name: frame.collect() for name, frame in reader.load(run_dir).items()}
    smoke = t["smoke"].filter(pl.col("target") == "served")
    assert sorted(smoke["check"].to_list()) == ["chat/completions", "completions", "models"]
    assert smoke["passed"].all()
    [row] = analysis.parity(t["requests"], t["tokens"], "hf-fp32").filter(pl.col("target") == "served").to_dicts()
    assert row["tf_top1_agreement"] == 1.0 and row["tf_max_abs_logprob_diff"] < 1e-4
    perf = t["perf_requests"].filter(pl.col("scenario") == "s")
    assert perf.height == 2 * 4 and (perf["n_output_tokens"] == 8).all()
    assert sorted(set(perf["target"])) == ["endpoint", "served"]
    assert servers_left == []


def test_a_level_spread_over_client_actors_in_a_whole_run(served_run: tuple[Path, Path, list[int]]) -> None:
    """The `spread` level of `served_run`, a whole run on real Ray: two client actors send one
    schedule to the endpoint, and their rows merge into the level's stored rows (the scheduler's
    part with CPUs to free is in test_idle_actors.py, on a fake Ray)."""
    from fleet.results import reader

    _, run_dir, _ = served_run
    t = {name: frame.collect() for name, frame in reader.load(run_dir).items()}
    rows = t["perf_requests"].filter(pl.col("scenario") == "spread").sort("request_index")
    assert rows["request_index"].to_list() == list(range(6)) and rows["target"].unique().to_list() == ["endpoint"]
    assert rows["client"].to_list() == [i % 2 for i in range(6)]  # every other arrival
    assert rows["error"].null_count() == 6 and (rows["n_output_tokens"] == 8).all()
    [level] = t["perf_levels"].filter(pl.col("scenario") == "spread").to_dicts()
    assert (level["clients"], level["n_requests"], level["n_errors"]) == (2, 6, 0)
    assert level["client_cpu_s"] > 0


def test_parity_under_load_over_http(served_run: tuple[Path, Path, list[int]]) -> None:
    """Both HTTP target kinds send a scenario's parity prompts alone and mid-load (the run in
    `served_run`); the reference scores them, and float32 stays on the reference's path."""
    from fleet.report.model import RunReport
    from fleet.results import reader

    _, run_dir, _ = served_run
    t = {name: frame.collect() for name, frame in reader.load(run_dir).items()}
    req, tok = t["load_requests"], t["load_tokens"]
    counts = req.group_by("target", "phase").len().sort("target", "phase").rows()
    assert counts == [("endpoint", "load", 4), ("endpoint", "solo", 4), ("served", "load", 4), ("served", "solo", 4)]
    assert (req.filter(pl.col("phase") == "load")["in_flight_sent"] >= 1).all()
    assert tok["ref_logprob"].null_count() == 0 and tok.height == req["n_output_tokens"].sum()
    levels = RunReport.build(run_dir, gates=[]).load_parity
    assert levels is not None and levels["target"].to_list() == ["endpoint", "served"]
    assert (levels["real_divergences"] == 0).all() and (levels["tf_p99_abs_logprob_diff"] < 1e-4).all()


def test_a_killed_actor_takes_its_server_along(server: tuple[Any, dict[str, str]], local_ray: Any) -> None:
    """Last in the module: it kills the module's server. Its clean stop is `served_run`'s (the
    scheduler stops the `served` target, and nothing of its process group outlives the run)."""
    from actors.server_group import members

    actor, info = server
    group = int(info["server_pgid"])
    assert processes_with("EngineCore", group), "the engine core never started"
    local_ray.kill(actor)  # no shutdown, no atexit: only the kernel and Ray act now
    deadline = time.monotonic() + 60
    while members(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert members(group) == set()
