"""One driver per run directory (fleet/results/driver_lock.py), with the test double on the session
Ray: a second driver of a run being written is refused before it touches anything, and the first
completes as if alone. What readers show once a driver is SIGKILLed is in
test_faults.py::test_killed_driver_resumes_only_missing_shards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from test_faults import assert_exactly_once, free_session_ray, write_manifest

from fleet.results import catalog, driver_lock, reader
from fleet.results.store import RunStore


def _fleet(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleet", *args], capture_output=True, text=True, env=env, timeout=120)


def test_a_second_driver_of_a_run_being_written_is_refused_and_the_first_completes(
    local_ray: Any, tmp_path: Path
) -> None:
    # Slow enough (0.15 s/token x 8 tokens x 2 prompts per shard, 6 shards a model) that the first
    # run is still writing while the second driver's two starts (~1.5 s each) are refused.
    manifest = write_manifest(tmp_path, cand=", seconds_per_token: 0.15", prompts=12)
    results, run_dir = tmp_path / "results", tmp_path / "results" / "busy"
    env = os.environ | {"RAY_ADDRESS": free_session_ray(local_ray)}
    cmd = [sys.executable, "-m", "fleet", "run", str(manifest), "--results", str(results), "--run-id", "busy"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(600):  # until its first shard is committed: the driver is writing
            if list((run_dir / "shards").glob("**/*.parquet")):
                break
            time.sleep(0.1)
        assert first.poll() is None, first.stderr.read() if first.stderr else ""
        recorded = (run_dir / "run.json").read_text()
        staged = sorted(p for p in (run_dir / ".staging").rglob("*") if p.is_file())

        for args in (["run", "--resume", str(run_dir)], ["run", "--check", "--resume", str(run_dir)]):
            second = _fleet(*args, env=env)
            assert second.returncode == 2, second.stderr
            assert f"another fleet run (pid {first.pid} on " in second.stderr
            assert "Traceback" not in second.stderr
        assert first.poll() is None  # the refusals above were of a run being written
        assert (run_dir / "run.json").read_text() == recorded  # not even resumed_at
        assert all(p.exists() for p in staged)  # its clean-up of staged files did not run
        assert reader.read_info(run_dir).status == "running"
        assert catalog.runs(results).row(0, named=True)["status"] == "running"
    finally:
        assert first.wait(timeout=300) == 0, first.stderr.read() if first.stderr else ""
    assert_exactly_once(run_dir, prompts=12)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    assert driver_lock.alive(run_dir) is False  # released at the end, the file left for readers


def test_no_lock_file_where_there_is_no_run(tmp_path: Path) -> None:
    """A directory that is not a run (bad input to --resume) gets nothing written into it."""
    with driver_lock.hold(RunStore(tmp_path)):
        pass
    assert list(tmp_path.iterdir()) == []
    assert driver_lock.alive(tmp_path) is None and driver_lock.status("running", tmp_path) == "running"
