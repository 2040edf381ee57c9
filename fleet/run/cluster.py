"""Ray for one run: join the cluster named (or start a private local one, never someone else's by
accident), check the manifest's targets fit it, and describe it for run.json."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.contracts.errors import Stopped, UserError
from fleet.run.placement import check_fits

if TYPE_CHECKING:
    from fleet.run.manifest import Manifest


def _connect(address: str | None, *, verbose: bool, num_cpus: int | None = None) -> bool:
    """Join the cluster at `address` (or $RAY_ADDRESS; "auto" finds one on this machine); without one
    start a private local Ray, never someone else's cluster by accident, with `num_cpus` CPU slots
    (default: the machine's cores). True if started here."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # else Ray 2.60 writes ~/.ray/auth_token
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    if num_cpus is not None and (address is not None or ray.is_initialized()):
        where = address or "this process's Ray"
        msg = f"--num-cpus sizes the private Ray that fleet run starts; the cluster at {where!r} has its own size"
        raise UserError(msg)
    if ray.is_initialized():
        return False
    sized = {} if num_cpus is None else {"num_cpus": num_cpus}
    ray.init(
        address=address or "local", include_dashboard=False, log_to_driver=verbose, configure_logging=verbose, **sized
    )
    return address is None


@contextlib.contextmanager
def ray_cluster(address: str | None, *, verbose: bool, num_cpus: int | None = None) -> Iterator[dict[str, float]]:
    """Ray for the run (see `_connect`), as its resources; a Ray started here is shut down after."""
    started_here = _connect(address, verbose=verbose, num_cpus=num_cpus)
    import ray

    try:
        with _stopped_by_sigterm():
            yield ray.cluster_resources()
    finally:
        if started_here:
            ray.shutdown()


_TERMINATED = threading.Event()


def terminated() -> bool:
    """Whether the last run of this process was stopped by SIGTERM (see `_stopped_by_sigterm`)."""
    return _TERMINATED.is_set()


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM raises Stopped in the main thread, as SIGINT raises KeyboardInterrupt: the run records
    itself `interrupted` and the CLI says how to resume. Installed after Ray's start, it also takes
    the place of Ray's C++ handler, which printed a stack dump and ended the driver with SIGABRT.
    Not in another thread (a driver run from a library's worker thread keeps what it has)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(*_: object) -> None:
        _TERMINATED.set()  # inside a Ray call, Ray raises its own KeyboardInterrupt instead of this
        raise Stopped

    _TERMINATED.clear()
    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        # None: the handler before was not Python's (an embedding's); the default is the honest guess.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def check_cluster(manifest: Manifest, cluster: dict[str, float], where: str | Path) -> None:
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    try:
        check_fits(manifest, cluster, nodes)
    except RuntimeError as e:
        raise UserError(f"{where}: {e}") from None


def cluster_info() -> dict[str, Any]:
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {"nodes": [n.get("NodeManagerHostname") for n in nodes], "resources": ray.cluster_resources()}
