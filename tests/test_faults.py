"""Faults survived with nothing lost: dead actors, hung engines, failed loads, NaN, a killed driver.

These use the `test-double` backend (labelled as such in its module and in every report): it has
no model, so a fault can be put on one chosen shard, once, deterministically. The real engines'
happy path is covered in test_engine_run.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
from own_processes import own_lines

from fleet.results import catalog, reader
from fleet.run import driver, idle_actors
from fleet.run.check import check_resume

MANIFEST = textwrap.dedent(
    """
    models:
      - name: m1
        source: {{kind: synthetic, seed: 1}}
      - name: m2
        source: {{kind: synthetic, seed: 2}}
    prompts:
      p:
    {prompts}
    targets:
      - {{name: ref, kind: test-double, num_cpus: 0.5{ref}}}
      - {{name: cand, kind: test-double, num_cpus: 0.5, logprob_shift: 0.01{cand}}}
    reference: ref
    sampling: {{max_tokens: 8, logprobs: 3}}
    run: {{shard_size: 2, shard_timeout_s: {timeout}, max_attempts: {attempts}}}
    """
)


# A hung shard waits this long. A healthy shard of the test double takes well under a second, but a
# loaded machine (`make test` runs two workers) can stretch a call by seconds: a tighter deadline
# failed healthy shards too.
HANG_TIMEOUT_S = 12


def write_manifest(
    tmp: Path, *, cand: str = "", ref: str = "", timeout: float = 60, attempts: int = 3, prompts: int = 6
) -> Path:
    lines = "\n".join(f'    - {{id: q{i}, prompt: "question {i}"}}' for i in range(prompts))
    path = tmp / "m.yaml"
    path.write_text(MANIFEST.format(prompts=lines, cand=cand, ref=ref, timeout=timeout, attempts=attempts))
    return path


def rows(run_dir: Path) -> dict[str, pl.DataFrame]:
    return {name: frame.collect() for name, frame in reader.load(run_dir).items()}


def assert_exactly_once(run_dir: Path, *, models: int = 2, prompts: int = 6, tokens: int = 8) -> None:
    t = rows(run_dir)
    assert t["requests"].height == models * 2 * prompts
    assert t["requests"].select("model", "target", "prompt_id").is_duplicated().sum() == 0
    assert t["tokens"].height == models * 2 * prompts * tokens
    assert t["tokens"].select("model", "target", "prompt_id", "position").is_duplicated().sum() == 0
    cand = t["tokens"].filter(pl.col("target") == "cand")
    assert cand["ref_logprob"].null_count() == 0  # every candidate row was scored


def actor_processes() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in own_lines(ps) if "ray::TargetActor" in line]


def free_session_ray(ray: Any) -> str:
    """The session Ray's address, for a `fleet run` in another process, once the actors the
    session's runs keep between them are killed (conftest's `local_ray`): that run cannot reuse
    them, and the slots they hold would keep its own actors from starting."""
    idle_actors.free_ray()
    return str(ray.get_runtime_context().gcs_address)


def assert_no_actors_left() -> None:
    """No target's actor is left, once the ones the session keeps idle between its runs (their
    engines shut down) are killed: a failed or hung actor is never among those."""
    idle_actors.free_ray()
    for _ in range(50):  # killed actors' workers exit asynchronously
        if not actor_processes():
            return
        time.sleep(0.2)
    assert actor_processes() == []


def cli_run(manifest: Path, results: Path, ray: Any) -> subprocess.CompletedProcess[str]:
    """`fleet run` as a user runs it (run id x), on the session's Ray."""
    cmd = [sys.executable, "-m", "fleet", "run", str(manifest), "--results", str(results), "--run-id", "x"]
    env = os.environ | {"RAY_ADDRESS": free_session_ray(ray)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def run(manifest: Path, tmp: Path, run_id: str) -> tuple[Path, Any]:
    return driver.run(manifest, results_dir=tmp / "results", run_id=run_id, progress=False)


def test_actor_killed_mid_shard_is_replaced_and_the_shard_retried(local_ray: Any, tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    faults.mkdir()
    manifest = write_manifest(tmp_path, cand=f", fault_dir: {faults}, die_shards: [m1/cand/p/00001]")
    run_dir, outcome = run(manifest, tmp_path, "die")
    assert (faults / "die-m1_cand_p_00001").exists()  # the fault really fired (SIGKILL of the actor)
    assert outcome.retries >= 1 and not outcome.partial
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    assert_exactly_once(run_dir)
    assert_no_actors_left()


def test_hung_shard_times_out_and_is_retried(local_ray: Any, tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    faults.mkdir()
    manifest = write_manifest(
        tmp_path, cand=f", fault_dir: {faults}, hang_shards: [m2/cand/p/00000]", timeout=HANG_TIMEOUT_S
    )
    run_dir, outcome = run(manifest, tmp_path, "hang")
    assert (faults / "hang-m2_cand_p_00000").exists()
    assert outcome.retries >= 1 and not outcome.partial
    assert_exactly_once(run_dir)
    assert_no_actors_left()


def test_shard_failing_every_attempt_is_recorded_and_the_rest_completes(local_ray: Any, tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    faults.mkdir()
    # One attempt only: the hang is never retried, so the shard fails and is recorded.
    manifest = write_manifest(
        tmp_path, cand=f", fault_dir: {faults}, hang_shards: [m1/cand/p/00002]", timeout=HANG_TIMEOUT_S, attempts=1
    )
    proc = cli_run(manifest, tmp_path / "r", local_ray)
    assert proc.returncode == 3, proc.stderr  # partial
    info = json.loads((tmp_path / "r" / "x" / "run.json").read_text())
    assert info["status"] == "partial" and list(info["failed_shards"]) == ["m1/cand/p/00002"]
    assert "FAILED shard m1/cand/p/00002" in proc.stdout
    t = rows(tmp_path / "r" / "x")
    assert t["requests"].height == 2 * 2 * 6 - 2  # everything but the failed shard's two prompts
    assert_no_actors_left()


def test_target_that_fails_to_load_is_recorded_and_others_complete(local_ray: Any, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, cand=", fail_to_load: true")
    run_dir, outcome = run(manifest, tmp_path, "load")
    assert set(outcome.failures) == {"m1/cand", "m2/cand"}
    assert "told to fail to load" in outcome.failures["m1/cand"]
    t = rows(run_dir)
    assert t["requests"]["target"].unique().to_list() == ["ref"]  # the reference still completed
    assert t["requests"].height == 2 * 6
    assert_no_actors_left()


def test_resume_scores_the_rows_no_reference_was_left_to_score(local_ray: Any, tmp_path: Path) -> None:
    # The references fail to load while this file exists. Not a once-only fault: the session keeps
    # idle actors, and a load that fails in one of those is retried in a new actor.
    blocker = tmp_path / "no-reference"
    blocker.touch()
    manifest = write_manifest(tmp_path, ref=f", fail_to_load_while: {blocker}")
    run_dir, outcome = run(manifest, tmp_path, "unscored")
    assert set(outcome.failures) == {"m1/ref", "m2/ref"}, outcome.failures
    assert all("told to fail to load" in reason for reason in outcome.failures.values())
    cand = rows(run_dir)["tokens"].filter(pl.col("target") == "cand")
    assert cand.height == 2 * 6 * 8 and cand["ref_logprob"].null_count() == cand.height  # stored, unscored
    # --resume scores them (and generates the references' shards), each row once.
    *_, unscored = check_resume(run_dir)
    assert sorted(unscored) == [f"{m}/cand/p/{i:05d}" for m in ("m1", "m2") for i in range(3)]
    stats = next((run_dir / "prompt_stats" / "model=m1").glob("*/target=cand/p-00000.parquet"))
    unscored_stats = stats.read_bytes()
    blocker.unlink()
    run_dir, outcome = driver.resume(run_dir, progress=False)
    assert outcome.failures == {} and not outcome.partial
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    assert_exactly_once(run_dir)  # every candidate row scored
    assert check_resume(run_dir)[4] == {}
    assert not (run_dir / ".staging").exists()
    # A driver killed while it replaced the unscored files (tokens scored, prompt_stats not yet):
    # the next resume scores that shard again.
    stats.write_bytes(unscored_stats)
    assert check_resume(run_dir)[4] == {"m1/cand/p/00000": stats.parent.parent.name.split("=")[1]}
    run_dir, _ = driver.resume(run_dir, progress=False)
    assert pl.read_parquet(stats)["first_ref_logprob"].null_count() == 0
    assert_exactly_once(run_dir)
    assert_no_actors_left()


def test_non_finite_logprobs_are_recorded(local_ray: Any, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, cand=", nan_shards: [m2/cand/p/00001]")
    run_dir, outcome = run(manifest, tmp_path, "nan")
    assert outcome.failures == {"m2/cand": "non-finite logprobs in shard m2/cand/p/00001"}
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "partial"


def test_killed_driver_resumes_only_missing_shards(local_ray: Any, tmp_path: Path) -> None:
    # Slow enough (0.05 s/token x 8 tokens x 2 prompts per shard) to be killed mid-run.
    manifest = write_manifest(tmp_path, cand=", seconds_per_token: 0.05", prompts=12)
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "fleet", "run", str(manifest), "--results", str(results), "--run-id", "cut"]
    env = os.environ | {"RAY_ADDRESS": free_session_ray(local_ray)}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    shards_dir = results / "cut" / "shards"
    try:
        for _ in range(600):  # wait until some but not all shards are written
            if len(list(shards_dir.glob("**/*.parquet"))) >= 4:
                break
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # A shard is complete once its shards file exists; the driver may have died between writing
    # a shard's requests/tokens files and its shards file: those are redone, the rest untouched.
    done = {p.relative_to(results / "cut" / "shards") for p in (results / "cut" / "shards").glob("**/*.parquet")}
    before = {
        p: p.stat().st_mtime_ns
        for table in ("requests", "tokens", "shards")
        for p in (results / "cut" / table).glob("**/*.parquet")
        if p.relative_to(results / "cut" / table) in done
    }
    assert 4 <= len(done) < 24
    assert json.loads((results / "cut" / "run.json").read_text())["status"] == "running"
    # No driver holds it any more (fleet/results/driver_lock.py): readers say so.
    assert reader.read_info(results / "cut").status == "interrupted"
    assert catalog.runs(results).row(0, named=True)["status"] == "interrupted"

    run_dir, outcome = driver.resume(results / "cut", progress=False)
    assert not outcome.partial
    after = {p: p.stat().st_mtime_ns for p in (results / "cut").glob("*/**/*.parquet")}
    assert all(after[p] == mtime for p, mtime in before.items())  # completed shards untouched
    assert_exactly_once(run_dir, prompts=12)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "complete" and len(info["resumed_at"]) == 1

    # Same keys and the same tokens as an uninterrupted run of the same manifest.
    whole, _ = run(manifest, tmp_path, "whole")
    keys = ["model", "target", "prompt_id", "position"]
    a = rows(run_dir)["tokens"].select(*keys, "token_id").sort(keys)
    b = rows(whole)["tokens"].select(*keys, "token_id").sort(keys)
    assert a.equals(b)
    assert_no_actors_left()


def test_models_run_concurrently_when_the_cluster_has_room(local_ray: Any, tmp_path: Path) -> None:
    # 2 CPUs, 4 actors of 0.5: both models' reference and candidate hold slots at once.
    manifest = write_manifest(tmp_path, cand=", seconds_per_token: 0.02")
    _, outcome = run(manifest, tmp_path, "together")
    # Admitted to finished, not the shards' own spans: those overlap only if the second model's
    # actors start before the first's few shards end, and an idle actor an earlier test left here
    # lets the first start at once (seen in a run of the suite in another order).
    spans = [[datetime.fromisoformat(t[k]) for k in ("admitted_at", "finished_at")] for t in outcome.timeline.values()]
    (s1, e1), (s2, e2) = spans
    assert s1 < e2 and s2 < e1  # both models held their slots at once


def test_unresolvable_source_fails_its_model_and_the_rest_completes(local_ray: Any, tmp_path: Path) -> None:
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file at all")
    manifest = write_manifest(tmp_path)
    text = manifest.read_text().replace(
        "  - name: m2\n    source: {kind: synthetic, seed: 2}",
        "  - name: m2\n    source: {kind: gguf, path: broken.gguf}",
    )
    manifest.write_text(text)
    proc = cli_run(manifest, tmp_path / "r", local_ray)
    assert proc.returncode == 3, proc.stderr  # partial: one model failed, the other completed
    assert "model 'm2'" in proc.stderr and "broken.gguf" in proc.stderr and "Traceback" not in proc.stderr
    info = json.loads((tmp_path / "r" / "x" / "run.json").read_text())
    assert set(info["failures"]) == {"m2/ref", "m2/cand"} and "broken.gguf" in info["failures"]["m2/ref"]
    assert rows(tmp_path / "r" / "x")["requests"]["model"].unique().to_list() == ["m1"]
