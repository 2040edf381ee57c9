"""actors/reaper.py with a stand-in actor: a Python process that starts a child (as an engine core
would), takes a sockets directory, calls guard_children and is then SIGKILLed or ends by itself.
The engines' own paths run in tests/test_accelerator_layout.py (a SIGKILLed actor's engine core
and sockets) and test_perf_engine.py / test_server.py (the directory gone after a shutdown or a
failed start)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from own_processes import alive

ROOT = Path(__file__).parents[1]
ACTOR = """
import subprocess, sys, time
from actors import reaper
child = subprocess.Popen(["sleep", "600"])
sockets = reaper.sockets_dir()
reaper.guard_children()
print(child.pid, sockets, flush=True)
time.sleep(float(sys.argv[1]))
"""


def _actor(tmp_path: Path, env: dict[str, str], lives: float) -> tuple[subprocess.Popen[str], int, Path]:
    env = os.environ | {"PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)} | env
    actor = subprocess.Popen([sys.executable, "-c", ACTOR, str(lives)], stdout=subprocess.PIPE, text=True, env=env)
    assert actor.stdout is not None
    child, sockets = actor.stdout.readline().split()
    return actor, int(child), Path(sockets)


def _until(condition: Callable[[], bool], within: float = 20) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("inherited", ["fleet-vllm-sockets-gone", None])
def test_a_killed_actor_takes_its_child_and_its_sockets_directory(tmp_path: Path, inherited: str | None) -> None:
    # A fleet-made directory inherited from a parent process (removed with its engine) is no base.
    env = {"VLLM_RPC_BASE_PATH": str(tmp_path / inherited)} if inherited else {}
    actor, child, sockets = _actor(tmp_path, env, lives=600)
    assert sockets.parent == tmp_path and sockets.name.startswith("fleet-vllm-sockets-") and sockets.is_dir()
    (sockets / "engine.sock").write_text("")  # what vLLM would have bound there
    os.kill(actor.pid, signal.SIGKILL)
    actor.wait()
    assert _until(lambda: not alive(child)), "the killed actor's child outlived it"
    assert _until(lambda: not sockets.exists()), "the killed actor's sockets directory was left behind"


def test_the_directory_goes_inside_a_base_the_target_sets(tmp_path: Path) -> None:
    base = tmp_path / "mine"
    base.mkdir()
    actor, child, sockets = _actor(tmp_path, {"VLLM_RPC_BASE_PATH": str(base)}, lives=0)
    assert sockets.parent == base
    actor.wait()  # the actor ends by itself, without a shutdown: the watcher still cleans up
    assert _until(lambda: not alive(child) and not sockets.exists())
    assert base.is_dir()  # the target's own directory stays
