"""A run whose Ray head (its GCS) stops answering ends resumable, with a message, before Ray ends it.

When the head goes (its node lost, `ray stop` there), the driver's main thread soon blocks inside
Ray: replacing a lost actor needs the GCS. Ray's C++ core then ends the process once it has not
reached the GCS for `gcs_rpc_server_reconnect_timeout_s` (60 s by default), running no Python code:
exit 1, which fleet documents as its own bug, and run.json left saying `running`. So a thread asks
the head once a second (a TCP connect to the GCS's port: Ray's own client would block too), and
when it has not answered for half of Ray's timeout, it records the run as `interrupted`, says how
to resume it, and ends the process itself, exit 5. Half, not less: a GCS that comes back within
that (Ray's GCS fault tolerance) keeps the run going. Committed shards are whole (the `shards` row
is written last), so what the run had not committed is simply done again by `--resume`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from fleet.results.store import now

if TYPE_CHECKING:
    from fleet.results.store import RunStore

EXIT_CLUSTER_LOST = 5
CHECK_EVERY_S = 1.0
CONNECT_TIMEOUT_S = 1.0
RAY_TIMEOUT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"  # how Ray's config is set from outside
RAY_TIMEOUT_DEFAULT_S = 60.0


def grace() -> float:
    """Half of the time Ray gives the GCS before it ends the driver."""
    try:
        return float(os.environ.get(RAY_TIMEOUT_ENV, RAY_TIMEOUT_DEFAULT_S)) / 2
    except ValueError:
        return RAY_TIMEOUT_DEFAULT_S / 2


class HeadWatch(threading.Thread):
    """Asks the head at `host:port` once a second; past `grace` s of silence, calls `lost`."""

    def __init__(self, host: str, port: int, grace: float, *, say: Callable[[str], None], lost: Callable[[str], None]):
        super().__init__(name="fleet-head-watch", daemon=True)
        self.host, self.port, self.grace = host, port, grace
        self.say, self.lost = say, lost
        self.stopped = threading.Event()

    def run(self) -> None:
        silent_since: float | None = None
        where = f"{self.host}:{self.port}"
        while not self.stopped.wait(CHECK_EVERY_S):
            if _answers(self.host, self.port):
                if silent_since is not None:
                    self.say(f"Ray's head at {where} answers again")
                silent_since = None
            elif silent_since is None:
                silent_since = time.monotonic()
                self.say(f"Ray's head at {where} does not answer; the run stops if it has not in {self.grace:g} s")
            elif time.monotonic() - silent_since >= self.grace and not self.stopped.is_set():
                self.lost(f"the Ray cluster's head at {where} has not answered for {self.grace:g} s")
                return


@contextlib.contextmanager
def watching(store: RunStore, say: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, a lost head ends the process as the module says. No watch where Ray
    does not say where its GCS is (Ray Client)."""
    where = _gcs()
    if where is None:
        yield
        return
    watch = HeadWatch(*where, grace(), say=say, lost=lambda why: _end(store, why))
    watch.start()
    try:
        yield
    finally:
        watch.stopped.set()


def _end(store: RunStore, why: str) -> None:
    """Record the run as interrupted, say how to go on, and end the process (see the module)."""
    with contextlib.suppress(Exception):  # the message and the exit matter more than the record
        store.update_info(status="interrupted", finished_at=now())
    print(
        f"\nerror: {why} (its node lost, or Ray stopped there): the run stops. Its committed shards are kept;\n"
        f"on a cluster that is up, continue it with: fleet run --resume {store.run_dir}\n"
        f"fleet run: exit {EXIT_CLUSTER_LOST}: the Ray cluster's head was lost",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    # Not an exception: the main thread is blocked inside Ray, and Ray would end the process anyway.
    os._exit(EXIT_CLUSTER_LOST)


def _gcs() -> tuple[str, int] | None:
    import ray

    try:
        address = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001  (a Ray that does not say where its GCS is: not watched)
        return None
    host, _, port = str(address).rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False
