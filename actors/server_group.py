"""The vLLM server's process group (actors/vllm_server.py starts the server in one of its own):
it must never outlive the actor, however the actor ends.

`launch` starts the server under a small supervisor process (`supervise`) that stops it when the
actor dies without stopping it, e.g. `ray.kill` (Linux only: it watches the actor through a
pidfd); `stop` is the actor's own way out (`shutdown`, a weakref finalizer at interpreter exit or
a failed start). `members` and `thread_env` read the group's live processes from /proc.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

SUPERVISE = "import sys; from actors.server_group import supervise; supervise(sys.argv[1:])"


def launch(cmd: list[str], *, grace_s: float, log: str, stderr: int, env: dict[str, str]) -> tuple[int, int]:
    """(the process group, the supervisor's pid; 0 if it did not start) of `cmd` started under a
    supervisor, in a process group of its own: everything the server starts is in it. `stderr`
    (the log's descriptor) takes the launcher's errors; the supervisor appends to `log`."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", SUPERVISE, str(os.getpid()), str(grace_s), log, *cmd],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,  # the supervisor's pid, one line
        stderr=stderr,
        env=env,
        start_new_session=True,
    )
    assert launcher.stdout is not None
    with launcher.stdout:
        supervisor = int(launcher.stdout.readline() or 0)
    launcher.wait()
    return launcher.pid, supervisor


def supervise(argv: list[str]) -> None:
    """Run as `python -c SUPERVISE ACTOR_PID GRACE_S LOG COMMAND...`: start the server and stop it
    (SIGTERM, after GRACE_S SIGKILL to the whole group) on SIGTERM, or when the actor or the
    server itself dies.

    It forks once and lets the launcher exit, so it is no child of the actor: Ray SIGKILLs a
    dying actor's children, and a SIGKILLed API server orphans its engine core (seen here: a
    1.8 GB process left running); vLLM also loses a SIGTERM that arrives during its start-up.
    """
    actor, grace, log, cmd = int(argv[0]), float(argv[1]), argv[2], argv[3:]
    if os.fork():
        os._exit(0)
    # A SIGTERM, whenever it comes, only writes a byte to this pipe, which the select below watches.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, lambda *_: None)
    with open(log, "ab") as out:  # noqa: PTH123  (appends, where the launcher's stderr would overwrite)
        os.dup2(out.fileno(), 2)
    server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=2, stderr=2)
    print(os.getpid(), flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # EOF for the actor reading our pid
    try:
        watched = [os.pidfd_open(server.pid), os.pidfd_open(actor)]
        select.select([*watched, wake_r], [], [])  # until the server or the actor exits, or SIGTERM
    except ProcessLookupError:  # the actor was gone already
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)  # vLLM stops its engine core itself
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=grace)
    clear_group(os.getpgid(0), grace, keep=os.getpid())
    print(f"fleet-eval: vLLM server exited with code {server.wait()}", file=sys.stderr, flush=True)


def stop(supervisor: int, group: int, timeout: float) -> None:
    """Stop the server through its supervisor; SIGKILL whatever of the group outlives it."""
    if supervisor:
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor, signal.SIGTERM)  # one SIGTERM: a second one forces uvicorn out unclean
    deadline = time.monotonic() + 2 * timeout + 5  # the supervisor's grace, then SIGKILL, then ours
    while members(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    clear_group(group, timeout)


def clear_group(pgid: int, grace: float, *, keep: int | None = None) -> None:
    """SIGTERM every live process of group `pgid` but `keep`; SIGKILL those left after `grace` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not (alive := members(pgid) - {keep}):
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while members(pgid) - {keep} and time.monotonic() < deadline:
            time.sleep(0.1)


def thread_env(pids: set[int]) -> dict[str, dict[str, str]]:
    """OMP_NUM_THREADS / MKL_NUM_THREADS / VLLM_CPU_OMP_THREADS_BIND as each server process
    started with them (its /proc environ), by pid: what the server's engine really runs with."""
    keys = {b"OMP_NUM_THREADS", b"MKL_NUM_THREADS", b"VLLM_CPU_OMP_THREADS_BIND"}
    out = {}
    for pid in sorted(pids):
        try:
            entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        pairs = (e.partition(b"=") for e in entries)
        out[str(pid)] = {k.decode(): v.decode() for k, _, v in pairs if k in keys}
    return out


def members(pgid: int) -> set[int]:
    """Live processes of a process group (Linux /proc). Zombies do not count: where PID 1 does not
    reap (containers), an orphan's zombie stays in its group for good."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):
            continue
        if int(group) == pgid and state != "Z":
            out.add(int(stat.parent.name))
    return out
