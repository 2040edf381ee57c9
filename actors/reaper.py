"""Engine processes that die with their actor, however the actor dies.

vLLM's engine core runs in a child of the actor on a GPU or NPU (`VLLM_ENABLE_V1_MULTIPROCESSING=1`,
vLLM's default there), and a tensor-parallel engine starts rank processes. An explicit
`shutdown()` stops them, but an actor that is SIGKILLed, OOM-killed or hung past its timeout never
runs it, and vLLM's engine core does not watch its parent (its rank processes watch the engine
core through a pipe): the engine core, holding the card's memory, would outlive the actor and the
retried shard's new engine would find the card full.

`guard_children()` starts a small watcher, detached from the actor, that holds a pidfd of the
actor and of every process the actor has started so far (the engine's tree), and SIGKILLs the
ones still alive when the actor exits. Without a sockets directory (below) it exits by itself once
the engine processes are gone (a normal shutdown). pidfds name the exact processes, so a reused pid
is never signalled.

The same goes for the sockets those processes bind: vLLM puts its ZMQ IPC sockets (engine core
to client, the TP ranks' message queues) under `VLLM_RPC_BASE_PATH`, /tmp by default, and a killed
process never unlinks them: a node's /tmp gathered thousands. `sockets_dir()` gives each vLLM
engine a directory of its own; the engine's shutdown removes it, or the watcher, which then waits
for the actor's end, when the actor dies. The watcher runs as a script (the standard library
only), not as an import of the actors package.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

SOCKETS = "VLLM_RPC_BASE_PATH"  # where vLLM binds its ZMQ IPC sockets (/tmp unless set)
_PREFIX = "fleet-vllm-sockets-"
_made: list[str] = []  # this process's sockets directories (sockets_dir)


def _own_base() -> str | None:
    """VLLM_RPC_BASE_PATH as a target's `env` set it, the directories' parent; not one fleet made
    (inherited from the process that started this one: removed with its engine) or one that is gone."""
    base = os.environ.get(SOCKETS)
    if base and Path(base).is_dir() and not Path(base).name.startswith(_PREFIX):
        return base
    return None


_BASE = _own_base()  # read once: then this process's own engines set it


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


def sockets_dir() -> str:
    """A new directory for the sockets of the vLLM engine about to start in this process and its
    children (set as VLLM_RPC_BASE_PATH); `remove` it at the engine's shutdown."""
    path = tempfile.mkdtemp(prefix=_PREFIX, dir=_BASE)
    os.environ[SOCKETS] = path
    _made.append(path)
    return path


def remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if path in _made:
        _made.remove(path)


@contextlib.contextmanager
def removed_on_error(path: str) -> Iterator[None]:
    """Remove the sockets directory `path` if the engine fails to start (no shutdown will)."""
    try:
        yield
    except BaseException:
        remove(path)
        raise


def guard_children() -> list[int]:
    """Make the processes this actor has started, and its engine's sockets directory, go with it;
    returns the processes' pids (no pid and no directory: no watcher)."""
    pids = descendants(os.getpid())
    if pids or _made:
        # The launcher forks the watcher and exits at once: the watcher is no child of the actor.
        spec = json.dumps({"actor": os.getpid(), "pids": pids, "dirs": _made})
        subprocess.run([sys.executable, "-S", __file__, spec], check=True)
    return pids


def watch(actor: int, pids: list[int], dirs: list[str]) -> None:
    """Run as `python actors/reaper.py SPEC` (see guard_children)."""
    if os.fork():
        os._exit(0)
    os.setsid()  # out of the actor's session: no signal sent to its group reaches the watcher
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
    # With a directory to remove, the watcher outlives the engine processes: the actor may die
    # after its engine ended by itself and before its shutdown removed the directory.
    while (engine or dirs) and actor_fd is not None:
        ready, _, _ = select.select([actor_fd, *engine], [], [])
        if actor_fd in ready:
            break
        for fd in ready:  # an engine process exited by itself
            engine.pop(fd)
            os.close(fd)
    for fd in engine:  # the actor died first: take its engine with it
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
    os._exit(0)


if __name__ == "__main__":
    watch(**json.loads(sys.argv[1]))
