"""The engine tests' paths once more in the process layout a GPU or NPU target gets.

On a card vLLM runs its engine core in a child process (`VLLM_ENABLE_V1_MULTIPROCESSING=1`, its
default), and everything fleet hands the engine crosses that boundary through msgspec. CPU
targets run the engine in the actor's process (fleet/contracts/backend_args.py `CPU_ENV`), so the rest
of the suite never crosses it. Here every vLLM target keeps what only vLLM's CPU build needs (the
KV-cache size and the thread binding) and takes the accelerator's layout instead (`ACCELERATOR`).

One run on a private local Ray of 4 CPU slots, in a subprocess (a process holds one Ray):
- `vllm-child`: generate + teacher-forced score against the HF float32 reference, two perf levels
  and the full-vocabulary logits probe; its actor is SIGKILLed mid-run by this test;
- `vllm-tp2-child`: tensor_parallel_size 2, vLLM's `mp` executor under the child engine core;
- `srv-child`: vLLM's OpenAI server with the same environment: smoke checks, generate and score.
Each path once (the engine starts are the cost); `pytest -m accelerator_layout` runs them alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import pytest
from own_processes import alive, own, parent

from fleet.analysis import parity as analysis
from fleet.results import reader

pytestmark = [pytest.mark.engine, pytest.mark.accelerator_layout]

# What an npu / cuda target runs with, beside what vLLM's CPU build needs here.
ACCELERATOR = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
KILL_MARK = "FLEET_TEST_KILL_THIS_ACTOR"  # only in the environment of the actor this test kills

MANIFEST = textwrap.dedent(
    """
    models:
      - name: tiny
        source: {{kind: synthetic, family: llama, seed: 11, hidden_size: 128, intermediate_size: 256,
                 num_layers: 2, num_heads: 4, num_kv_heads: 2, init_std: 0.1}}
    prompts:
      p:
        - {{id: a, prompt: "The capital of France is"}}
        - {{id: b, prompt: "Quantum computing is"}}
        - {{id: c, prompt: "Two plus two equals"}}
        - {{id: d, messages: [{{role: user, content: "What is the meaning of life?"}}]}}
    targets:
      - {{name: hf-fp32, kind: hf, dtype: float32}}
      - {{name: vllm-child, kind: vllm, dtype: float32, max_model_len: 256, env: {kill_env}}}
      - {{name: vllm-tp2-child, kind: vllm, dtype: float32, tensor_parallel_size: 2, num_cpus: 2,
          max_model_len: 256, env: {env}}}
      - {{name: srv-child, kind: vllm-server, dtype: float32, max_model_len: 256, env: {env}}}
    reference: hf-fp32
    # Long enough (a few seconds of decoding per shard) for the test to kill vllm-child mid-shard.
    sampling: {{max_tokens: 200, logprobs: 3}}
    run: {{shard_size: 2}}
    probes:
      logits: {{prompt_set: p}}
    perf:
      - {{name: short, concurrency: [1, 4], input_tokens: 24, output_tokens: 12, num_requests: 8,
          warmup_requests: 2, targets: [vllm-child]}}
    """
).format(env=json.dumps(ACCELERATOR), kill_env=json.dumps(ACCELERATOR | {KILL_MARK: "1"}))

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import ray
    from fleet.run import driver

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    run_dir, outcome = driver.run(Path(sys.argv[1]), results_dir=Path(sys.argv[2]), run_id="al", progress=False)
    ray.shutdown()
    print(json.dumps({"retries": outcome.retries, "failures": outcome.failures, "failed": outcome.failed_shards}))
    """
)


def _marked(pid: int) -> bool:
    try:
        return f"{KILL_MARK}=1".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _cmdline(pid: int | str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _sockets_dir(pid: int) -> Path | None:
    """Where the process binds vLLM's IPC sockets (VLLM_RPC_BASE_PATH, as fleet set it for its engine)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [v.split(b"=", 1)[1] for v in environ if v.startswith(b"VLLM_RPC_BASE_PATH=")]
    return Path(found[0].decode()) if found else None


def _kill_mid_shard(run: subprocess.Popen[str], timeout: float = 600) -> tuple[int, int, Path | None, int]:
    """SIGKILL vllm-child's actor while it generates, once its engine core (a child process)
    runs; returns (actor pid, engine-core pid, its sockets directory, the sockets it held). Each
    round reads one file per process, and more only of engine cores: reading every process's
    command line and status each 20 ms was ~17 s of a core over the run's start, in a suite
    bound by CPU."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.poll() is None:
        for proc in Path("/proc").glob("[0-9]*"):
            pid = proc.name
            if "EngineCore" not in _cmdline(pid):
                continue
            actor = parent(pid)
            if _cmdline(actor).startswith("ray::TargetActor.generate") and _marked(actor):
                sockets = _sockets_dir(int(pid))
                held = sum(p.is_socket() for p in sockets.iterdir()) if sockets and sockets.is_dir() else 0
                os.kill(actor, signal.SIGKILL)
                return actor, int(pid), sockets, held
        time.sleep(0.1)
    pytest.fail("vllm-child never generated with its engine core in a child process")


@pytest.fixture(scope="module")
def layout_run(tmp_path_factory: pytest.TempPathFactory, fleet_cache: Path) -> tuple[Path, dict[str, object], bool]:
    base = tmp_path_factory.mktemp("accelerator-layout")
    (base / "m.yaml").write_text(MANIFEST)
    (base / "run.py").write_text(SCRIPT)
    cmd = [sys.executable, str(base / "run.py"), str(base / "m.yaml"), str(base / "results")]
    # Ray 2.60 kills a dead worker's process group (RAY_process_group_cleanup_enabled), which takes
    # the engine core along; other Ray versions and settings do not. Off here, so that what is
    # tested is fleet's own guarantee (actors/reaper.py), whatever the cluster's Ray does.
    env = os.environ | {"RAY_process_group_cleanup_enabled": "0"}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as run:
        _actor, core, sockets, held = _kill_mid_shard(run)
        gone = _gone(core, within=60)  # the killed actor's engine core must not outlive it
        stdout, stderr = run.communicate(timeout=900)
    assert run.returncode == 0, stderr[-4000:]
    # Nor its sockets: fleet gave the engine a directory of its own (not /tmp), which held them.
    assert sockets is not None and sockets.name.startswith("fleet-vllm-sockets-") and held > 0, (sockets, held)
    assert not sockets.exists(), f"{sockets}: the killed actor's sockets directory was left behind"
    return base / "results" / "al", json.loads(stdout.strip().splitlines()[-1]), gone


def _gone(pid: int, *, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def _orphaned_engine_cores() -> list[int]:
    """This session's live engine cores whose parent died (re-parented to init)."""
    cores = (int(p.name) for p in Path("/proc").glob("[0-9]*") if "EngineCore" in _cmdline(p.name))
    return [pid for pid in cores if parent(pid) == 1 and alive(pid) and own(pid)]


def test_the_killed_actors_engine_core_goes_with_it_and_the_shard_is_retried_once(
    layout_run: tuple[Path, dict[str, object], bool],
) -> None:
    run_dir, outcome, core_gone = layout_run
    assert core_gone, "the SIGKILLed actor's EngineCore process outlived it"
    assert outcome == {"retries": 1, "failures": {}, "failed": {}}
    t = {name: frame.collect() for name, frame in reader.load(run_dir).items()}
    keys = ["target", "prompt_id", "position"]
    assert t["tokens"].select(keys).is_duplicated().sum() == 0  # the retried shard's rows once
    per_target = t["requests"].group_by("target").len()
    assert dict(per_target.iter_rows()) == dict.fromkeys(("hf-fp32", "vllm-child", "vllm-tp2-child", "srv-child"), 4)
    assert not _orphaned_engine_cores()


def test_parity_equals_the_in_process_layouts(layout_run: tuple[Path, dict[str, object], bool]) -> None:
    t = reader.load(layout_run[0])
    rows = {r["target"]: r for r in analysis.parity(t["requests"], t["tokens"], "hf-fp32").to_dicts()}
    for name in ("vllm-child", "vllm-tp2-child", "srv-child"):  # float32 against float32
        assert rows[name]["n_prompts"] == 4, name
        assert rows[name]["tf_top1_agreement"] == 1.0, name
        assert rows[name]["tf_max_abs_logprob_diff"] <= 1e-4, (name, rows[name]["tf_max_abs_logprob_diff"])


def test_every_rank_reports_its_threads_across_the_process_boundary(
    layout_run: tuple[Path, dict[str, object], bool],
) -> None:
    prov = json.loads((layout_run[0] / "run.json").read_text())["provenance"]
    threads = {key.split("/")[1]: json.loads(p["threads"]) for key, p in prov.items()}
    assert threads["vllm-child"]["rank_threads"] == [1]  # asked of the engine core's process by name
    assert threads["vllm-tp2-child"]["rank_threads"] == [1, 1]
    assert threads["vllm-tp2-child"]["cpu_bind"] == "0|1"


def test_perf_probes_and_smoke_run_in_the_accelerator_layout(
    layout_run: tuple[Path, dict[str, object], bool],
) -> None:
    t = {name: frame.collect() for name, frame in reader.load(layout_run[0]).items()}
    perf = t["perf_requests"].filter(pl.col("target") == "vllm-child")
    assert perf.group_by("level").len().sort("level").rows() == [(1, 8), (4, 8)]
    assert perf["error"].null_count() == perf.height and (perf["n_output_tokens"] == 12).all()
    logits = t["logits"].filter(pl.col("target") == "vllm-child")
    assert logits.height > 0
    smoke = t["smoke"].filter(pl.col("target") == "srv-child")
    assert smoke.height == 3 and smoke["passed"].all()
