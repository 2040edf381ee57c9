"""A results store that refuses a write mid-run (a full disk, a quota, a read-only mount) stops the
run resumable, exit 6, with a message: not "a bug in fleet-eval" and a traceback.

The refusal is the kernel's own: once some shards are committed, the running driver's file-size
limit (RLIMIT_FSIZE, lowered from outside with prlimit) goes below a shard file's size, so its next
write fails with EFBIG as a full disk fails with ENOSPC. Python ignores SIGXFSZ, so the write
returns the error rather than the signal ending the process.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from test_faults import assert_exactly_once, assert_no_actors_left, free_session_ray, write_manifest

from fleet.run import driver


def test_a_refused_write_stops_the_run_resumable(local_ray: Any, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, cand=", seconds_per_token: 0.05")  # 12 shards of 2 prompts
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "fleet", "run", str(manifest), "--results", str(results), "--run-id", "full"]
    env = os.environ | {"RAY_ADDRESS": free_session_ray(local_ray)}
    run = subprocess.Popen(
        [*cmd, "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 180
        while len(list((results / "full" / "shards").glob("**/*.parquet"))) < 2 and run.poll() is None:
            assert time.monotonic() < deadline, "no shard was committed"
            time.sleep(0.05)
        resource.prlimit(run.pid, resource.RLIMIT_FSIZE, (256, 256))  # no shard file is that small
        _, stderr = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
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
