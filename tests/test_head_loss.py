"""A run whose Ray head is lost mid-run ends resumable, with a message (fleet/run/head_watch.py).

A Ray head of its own (`ray start --head --block`; `ray stop` would also stop the session's other
Ray), its GCS SIGKILLed while a `fleet run` of the test double runs on it. Ray's own timeout for a
lost GCS is set to 10 s here, so fleet's half of it is 5 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import polars as pl
from own_ports import free_port, head_command

from fleet.run import driver

MANIFEST = textwrap.dedent(
    """
    models:
      - {name: m1, source: {kind: synthetic, seed: 1}}
    prompts:
      p: [{id: a, prompt: "one"}, {id: b, prompt: "two"}, {id: c, prompt: "three"}, {id: d, prompt: "four"}]
    targets:
      - {name: ref, kind: test-double, num_cpus: 0.5}
      - {name: cand, kind: test-double, num_cpus: 0.5, seconds_per_token: 0.1}
    reference: ref
    sampling: {max_tokens: 8, logprobs: 2}
    run: {shard_size: 1}
    """
)


def _gcs_of(marker: str) -> int | None:
    """The pid of the GCS server started with `marker` in its environment."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"gcs_server" in (proc / "cmdline").read_bytes() and marker.encode() in (proc / "environ").read_bytes():
                return int(proc.name)
        except OSError:
            continue
    return None


def test_a_run_whose_ray_head_is_lost_ends_resumable(local_ray: Any, tmp_path: Path) -> None:
    marker = f"FLEET_TEST_HEAD={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | dict([marker.split("=")])
    env["RAY_gcs_rpc_server_reconnect_timeout_s"] = "10"
    port = free_port()
    cmd = [*head_command(port), "--include-dashboard=false"]
    (tmp_path / "m.yaml").write_text(MANIFEST)
    results = tmp_path / "results"
    head = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fleet_run = [sys.executable, "-m", "fleet", "run", str(tmp_path / "m.yaml"), "--results", str(results)]
    try:
        run = subprocess.Popen(
            [*fleet_run, "--run-id", "h", "--no-progress"],
            env=env | {"RAY_ADDRESS": f"127.0.0.1:{port}"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 180
        while not list((results / "h" / "shards").glob("**/*.parquet")) and run.poll() is None:
            assert time.monotonic() < deadline, "no shard was committed"
            time.sleep(0.2)
        gcs = _gcs_of(marker)
        assert gcs is not None, "the head's GCS server was not found"
        os.kill(gcs, signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = run.communicate(timeout=120)
        took = time.monotonic() - killed
    finally:
        head.send_signal(signal.SIGTERM)  # stops what is left of that cluster
        head.wait(timeout=120)
    assert run.returncode == 5, stderr[-3000:]
    assert "has not answered for 5 s" in stderr and f"fleet run --resume {results / 'h'}" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and "Failed to connect to GCS" not in stderr  # fleet spoke before Ray ended it
    assert took < 10, took
    assert json.loads((results / "h" / "run.json").read_text())["status"] == "interrupted"

    # Resumed on a cluster that is up (the session's): every row once, every candidate row scored.
    run_dir, outcome = driver.resume(results / "h", progress=False)
    assert not outcome.failures and not outcome.partial
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    tokens = pl.read_parquet(run_dir / "tokens" / "**" / "*.parquet", hive_partitioning=True)
    assert tokens.height == 2 * 4 * 8
    assert tokens.select("target", "prompt_id", "position").is_duplicated().sum() == 0
    assert tokens.filter(pl.col("target") == "cand")["ref_logprob"].null_count() == 0


def test_a_head_silent_for_less_than_the_grace_keeps_the_run(monkeypatch: Any) -> None:
    """The watch itself, against a port that stops, then starts, then stops answering."""
    import socket

    from fleet.run import head_watch

    monkeypatch.setattr(head_watch, "CHECK_EVERY_S", 0.05)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    said: list[str] = []
    lost: list[str] = []
    watch = head_watch.HeadWatch("127.0.0.1", port, 1.0, say=said.append, lost=lost.append)
    watch.start()

    def until(what: Any) -> None:
        deadline = time.monotonic() + 10
        while not what():
            assert time.monotonic() < deadline, (said, lost)
            time.sleep(0.02)

    try:
        time.sleep(0.2)
        assert said == [] and lost == []  # answering: nothing said
        listener.close()
        until(lambda: said)
        assert said == [f"Ray's head at 127.0.0.1:{port} does not answer; the run stops if it has not in 1 s"]
        listener = socket.create_server(("127.0.0.1", port))  # back within the grace
        until(lambda: len(said) == 2)
        assert said[1] == f"Ray's head at 127.0.0.1:{port} answers again" and lost == []
        listener.close()
        until(lambda: lost)
        assert lost == [f"the Ray cluster's head at 127.0.0.1:{port} has not answered for 1 s"]
        assert len(said) == 3
    finally:
        watch.stopped.set()
        listener.close()
    watch.join(timeout=5)
    assert not watch.is_alive()
