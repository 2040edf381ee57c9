"""`ray job submit --working-dir . -- python -m fleet run ...` against a Ray head on loopback.

The head is started here (`ray start --head --block`, stopped by SIGTERM, which takes its whole
cluster down; `ray stop` would also kill the session's other Ray) and the job runs the tiny
manifest with real engines, writing where the test can read.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from own_ports import BIN, free_port, head_command

pytestmark = pytest.mark.engine
REPO = Path(__file__).parents[1]


@pytest.fixture
def ray_head(fleet_cache: Path, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    port, dashboard = free_port(), free_port()
    env = os.environ | {"PATH": f"{BIN}:{os.environ['PATH']}", "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    cmd = [*head_command(port), "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}"]
    log = (tmp_path / "head.log").open("w")
    head = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{dashboard}"
    try:
        # Ready once a trivial job runs: the job server answers before its agent can take jobs.
        probe_cmd = [str(BIN / "ray"), "job", "submit", "--address", url, "--", "python", "-c", "pass"]
        for _ in range(60):
            probe = subprocess.run(probe_cmd, env=env, capture_output=True, timeout=120)
            if probe.returncode == 0:
                break
            time.sleep(2)
        else:
            pytest.fail(f"Ray head did not come up: {(tmp_path / 'head.log').read_text()[-2000:]}")
        yield url, env
    finally:
        head.send_signal(signal.SIGTERM)
        head.wait(timeout=120)
        log.close()


def test_ray_job_submit_runs_a_manifest(ray_head: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    url, env = ray_head
    results = tmp_path / "results"
    cmd = [str(BIN / "ray"), "job", "submit", "--address", url, "--working-dir", "."]
    cmd += ["--", "python", "-m", "fleet", "run", "manifests/tiny.yaml", "--results", str(results)]
    # One candidate is enough to show the job's plumbing (the suite's time); --set travels with the job.
    targets = "targets=[{name: hf-cpu-fp32, kind: hf, dtype: float32}, {name: vllm-cpu-bf16, kind: vllm,"
    targets += " dtype: bfloat16, max_model_len: 256}]"
    cmd += ["--run-id", "job", "--no-progress", "--set", targets]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in proc.stdout + proc.stderr
    info = json.loads((results / "job" / "run.json").read_text())
    assert info["status"] == "complete"
    assert set(info["provenance"]) == {"tiny-llama/hf-cpu-fp32", "tiny-llama/vllm-cpu-bf16"}
    assert "## Parity vs reference" in proc.stdout  # the job's own summary, streamed back
