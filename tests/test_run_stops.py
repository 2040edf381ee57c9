"""A run that stops mid-way for a reason outside fleet stops resumable, with a message and its own
exit code, not "a bug in fleet-eval" and a traceback:

- a results store that refuses a write (a full disk, a quota, a read-only mount): exit 6. The
  refusal is the kernel's own: once some shards are committed, the running driver's file-size limit
  (RLIMIT_FSIZE, lowered from outside with prlimit) goes below a shard file's size, so its next
  write fails with EFBIG as a full disk fails with ENOSPC (Python ignores SIGXFSZ, so the write
  returns the error rather than the signal ending the process). Where the actors write their own
  rows (run.write: actors) it is their limit, and the run stops the same way: retrying the shard on
  a new engine would meet the same store;
- SIGTERM (`ray job stop`, a scheduler's preemption): exit 143, where Ray's own handler printed a
  stack dump and aborted the driver (exit 134).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from own_processes import parent
from test_faults import assert_exactly_once, assert_no_actors_left, free_session_ray, write_manifest

from fleet.run import driver


def _started(ray: Any, tmp_path: Path, run_id: str, *flags: str) -> subprocess.Popen[str]:
    """`fleet run` of 12 shards of 2 prompts on the session's Ray, once two shards are committed."""
    manifest = write_manifest(tmp_path, cand=", seconds_per_token: 0.05")
    cmd = [sys.executable, "-m", "fleet", "run", str(manifest), "--results", str(tmp_path / "results"), *flags]
    env = os.environ | {"RAY_ADDRESS": free_session_ray(ray)}
    run = subprocess.Popen(
        [*cmd, "--run-id", run_id, "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    shards = tmp_path / "results" / run_id / "shards"
    deadline = time.monotonic() + 180
    while len(list(shards.glob("**/*.parquet"))) < 2 and run.poll() is None:
        if time.monotonic() > deadline:
            run.kill()
            raise AssertionError("no shard was committed")
        time.sleep(0.05)
    return run


def _ended(run: subprocess.Popen[str]) -> str:
    try:
        return run.communicate(timeout=180)[1]
    finally:
        if run.poll() is None:
            run.kill()


def test_a_refused_write_stops_the_run_resumable(local_ray: Any, tmp_path: Path) -> None:
    run = _started(local_ray, tmp_path, "full")
    resource.prlimit(run.pid, resource.RLIMIT_FSIZE, (256, 256))  # no shard file is that small
    stderr = _ended(run)
    results = tmp_path / "results"
    assert run.returncode == 6, stderr[-3000:]
    assert "error: the results store refused a write: " in stderr and "File too large" in stderr, stderr[-3000:]
    assert f"fleet run --resume {results / 'full'}" in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert "fleet run: exit 6: the results store refused a write" in stderr
    assert not list((results / "full").glob("**/.*.tmp"))  # no half-written file left beside the rows
    # run.json could not be updated either (it is larger than the limit): it still says running.
    assert json.loads((results / "full" / "run.json").read_text())["status"] == "running"

    # With the store taking writes again: every row once, every candidate row scored.
    run_dir, outcome = driver.resume(results / "full", progress=False)
    assert not outcome.partial and not outcome.failures
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    assert_exactly_once(run_dir)
    assert_no_actors_left()


def _session_target_actors() -> list[int]:
    """The target actors on this process's Ray: workers of the raylet this process started."""
    actors = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            title = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if title.startswith(b"ray::TargetActor") and parent(parent(proc.name)) == os.getpid():
            actors.append(int(proc.name))
    return actors


def test_a_store_refusing_an_actors_write_stops_the_run_resumable(local_ray: Any, tmp_path: Path) -> None:
    run = _started(local_ray, tmp_path, "full", "--set", "run.write=actors")
    actors = _session_target_actors()
    assert actors
    for pid in actors:  # those started later write freely: the run stops at the first refusal
        with contextlib.suppress(ProcessLookupError):  # an earlier test's idle actor, killed meanwhile
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (256, 256))
    stderr = _ended(run)
    results = tmp_path / "results"
    assert run.returncode == 6, stderr[-3000:]
    assert f"error: the results store refused a write: {results / 'full' / '.staging'}" in stderr, stderr[-3000:]
    assert "File too large" in stderr and f"fleet run --resume {results / 'full'}" in stderr, stderr[-3000:]
    assert "retry" not in stderr and "Traceback" not in stderr, stderr[-3000:]  # no new engine met it again
    assert json.loads((results / "full" / "run.json").read_text())["status"] == "interrupted"

    run_dir, outcome = driver.resume(results / "full", progress=False)
    assert not outcome.partial and not outcome.failures
    assert json.loads((run_dir / "run.json").read_text())["write"] == "actors"
    assert_exactly_once(run_dir)
    assert not (run_dir / ".staging").exists()
    assert_no_actors_left()


def test_sigterm_stops_the_run_resumable(local_ray: Any, tmp_path: Path) -> None:
    run = _started(local_ray, tmp_path, "term")
    run.send_signal(signal.SIGTERM)
    stderr = _ended(run)
    run_dir = tmp_path / "results" / "term"
    assert run.returncode == 143, stderr[-3000:]
    expected = f"stopped (SIGTERM): the run's committed shards are kept; continue it with: fleet run --resume {run_dir}"
    assert expected in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and "SIGTERM received" not in stderr, stderr[-3000:]  # Ray's stack dump
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert_no_actors_left()  # its actors went with its Ray job (the resume is the refused write's test)


def test_the_sigterm_handler_is_the_runs_only() -> None:
    """Within a run SIGTERM raises Stopped and is remembered; after it, the handler before is back."""
    from fleet.contracts.errors import Stopped
    from fleet.run import cluster

    before = signal.getsignal(signal.SIGTERM)
    try:
        with cluster._stopped_by_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode boundary
        raise AssertionError("SIGTERM did not stop the block")
    except Stopped:
        pass
    assert cluster.terminated()
    assert signal.getsignal(signal.SIGTERM) == before
