"""Engine processes that die with their actor, however the actor dies.

vLLM's engine core runs in a child of the actor on a GPU or NPU (`VLLM_ENABLE_V1_MULTIPROCESSING=1`,
vLLM's default there), and a tensor-parallel engine starts rank processes. An explicit
`shutdown()` stops them, but an actor that is SIGKILLed, OOM-killed or hung past its timeout never
runs it, and vLLM's engine core does not watch its parent (its rank processes watch the engine
core through a pipe): the engine core, holding the card's memory, would outlive the actor and the
retried shard's new engine would find the card full.

`guard_children()` starts a small watcher, detached from the actor, that holds a pidfd of the
actor and of every process the actor has started so far (the engine's tree), and SIGKILLs the
ones still alive when the actor exits. It exits by itself once the engine processes are gone (a
normal shutdown). pidfds name the exact processes, so a reused pid is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

WATCH = "import sys; from actors.reaper import watch; watch(sys.argv[1:])"


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (Linux /proc), parents before children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(stat.parent.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo += children.get(child, [])
    return out


def guard_children() -> list[int]:
    """Make the processes this actor has started die with it; returns their pids (none: no watcher)."""
    pids = descendants(os.getpid())
    if pids:
        # The launcher forks the watcher and exits at once: the watcher is no child of the actor.
        subprocess.run([sys.executable, "-c", WATCH, str(os.getpid()), *map(str, pids)], check=True)
    return pids


def watch(argv: list[str]) -> None:
    """Run as `python -c WATCH ACTOR_PID PID...` (see guard_children)."""
    if os.fork():
        os._exit(0)
    os.setsid()  # out of the actor's session: no signal sent to its group reaches the watcher
    actor, *pids = map(int, argv)
    engine = {}
    for pid in pids:
        try:
            engine[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    try:
        actor_fd = os.pidfd_open(actor)
    except ProcessLookupError:  # the actor is gone already
        actor_fd = None
    while engine and actor_fd is not None:
        ready, _, _ = select.select([actor_fd, *engine], [], [])
        if actor_fd in ready:
            break
        for fd in ready:  # an engine process exited by itself
            engine.pop(fd)
            os.close(fd)
    for fd in engine:  # the actor died first: take its engine with it
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    os._exit(0)
