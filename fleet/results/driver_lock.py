"""One driver per run directory, and whether a run's driver is still there.

A driver holds an exclusive lock (flock) on RUN_DIR/.driver.lock from before it writes anything
until it ends, and writes who it is into that file. The kernel drops the lock when the process
dies however it dies (SIGKILL, the OOM killer, its node's NFS client gone), which run.json cannot
record. So:
- a second `fleet run --resume` of a run that a live driver is writing is refused before it
  touches anything: its clean-up of staged files would delete the other's uncommitted shards, and
  both would run the same shards;
- a run whose run.json still says `running` while nobody holds its lock was stopped without the
  chance to say so: readers show it `interrupted`, as a run stopped by Ctrl-C is recorded.

Local and NFS-mounted run directories only. An object store has no locks: there run.json stays the
only record, as does a run written before this file existed. Readers list no dot files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from fleet.contracts.errors import UserError
from fleet.contracts.inputs import cut
from fleet.results.store import RUN_JSON, RunStore, now

LOCK = ".driver.lock"
# A reader's probe holds the lock for microseconds; a driver starting just then tries again.
_ATTEMPTS, _PAUSE_S = 20, 0.05
# A file system without flock (some parallel file systems) says so with one of these.
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


@contextlib.contextmanager
def hold(store: RunStore) -> Iterator[None]:
    """Hold `store`'s run for this driver until the block ends; UserError naming the driver that
    holds it already. Nothing is created where there is no run.json: bad input is reported by the
    check that reads it, and a directory that is not a run gets no lock file."""
    path = Path(store.root) / LOCK
    if not store.local or not (Path(store.root) / RUN_JSON).is_file():
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # a read-only or foreign results directory: this driver could write nothing
        raise UserError(f"{cut(str(store.run_dir), 200)}: cannot write {LOCK} there: {e.strerror}") from None
    try:
        locked = _lock(fd, fcntl.LOCK_EX, attempts=_ATTEMPTS)
        if locked is False:
            raise UserError(_busy(store.run_dir, path))
        if locked:  # None: a file system without locks, where run.json stays the only record
            os.ftruncate(fd, 0)
            me = {"pid": os.getpid(), "host": socket.gethostname(), "since": now()}
            os.write(fd, json.dumps(me).encode())
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


def refuse_if_held(run_dir: str | Path) -> None:
    """UserError if a driver other than this process holds the run (`fleet run --check --resume`)."""
    path = Path(str(run_dir)) / LOCK
    holder = _holder(path)
    if alive(run_dir) and (holder.get("pid"), holder.get("host")) != (os.getpid(), socket.gethostname()):
        raise UserError(_busy(run_dir, path))


def alive(run_dir: str | Path) -> bool | None:
    """Whether a driver holds the run: None where that cannot be told (no lock file: an object
    store, a run from before; a file system without locks)."""
    try:
        fd = os.open(Path(str(run_dir)) / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        locked = _lock(fd, fcntl.LOCK_SH, attempts=1)
        return None if locked is None else not locked
    finally:
        os.close(fd)


def status(recorded: str | None, run_dir: str | Path) -> str | None:
    """The status to show: run.json's, except `running` where no driver holds the run any more."""
    return "interrupted" if recorded == "running" and alive(run_dir) is False else recorded


def _lock(fd: int, kind: int, *, attempts: int) -> bool | None:
    """Take the lock without waiting (a few tries): True taken, False held by another, None no locks here."""
    for attempt in range(attempts):
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < attempts:
                time.sleep(_PAUSE_S)
        except OSError as e:
            if e.errno in _NO_LOCKS:
                return None
            raise
    return False


def _holder(path: Path) -> dict[str, object]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _busy(run_dir: str | Path, path: Path) -> str:
    who = {k: cut(str(v), 60) for k, v in ({"pid": "?", "host": "?", "since": "?"} | _holder(path)).items()}
    by = f"pid {who['pid']} on {who['host']} since {who['since']}"
    return f"{cut(str(run_dir), 200)}: another fleet run ({by}) is writing this run; let it finish, or stop it first"
