"""Processes of this test session only. Under pytest-xdist (`make test`) two workers run side by
side, each with its own local Ray: a check that no engine is left behind must not see the other
worker's live engines. Every process a worker starts (Ray's raylet, its actors, their engine
children and servers) inherits the worker's `PYTEST_XDIST_WORKER` variable, and keeps it after its
parent dies, so an orphan still counts as this worker's."""

from __future__ import annotations

import os
from pathlib import Path


def own(pid: int | str) -> bool:
    """The process was started from this pytest process (always true without xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return True
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone already, or not ours to read
        return False
    return f"PYTEST_XDIST_WORKER={worker}".encode() in environ


def own_lines(ps_output: str) -> list[str]:
    """The lines of `ps -eo pid,...` output (pid first) whose process is this session's."""
    return [line for line in ps_output.splitlines() if line.split(None, 1)[:1] and own(line.split(None, 1)[0])]


def alive(pid: int | str) -> bool:
    """The process exists and is no zombie (a killed child its parent has not reaped yet is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def parent(pid: int | str) -> int:
    """The parent's pid of a live process; 0 once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0
