"""Actors kept between targets: a target's actor whose engine shut down cleanly waits here, and the
next target of the same shape builds its engine in that process instead of a new one.

Most of an engine's start is its process's start, not the engine: a new actor process imports
vLLM (11-12 s on a quiet 2-core host; torch_npu's init on a card) before it builds a tiny CPU
engine in 2-3 s (docs/measurements.md). A matrix's variants, calibrate's mutants and the models
of a manifest run one after another on the same shape of actor, so each reuses the last one's.

Within `across_runs()` the kept actors also outlive a run, for the next run in that block on the
same Ray (fleet calibrate's healthy and mutant runs, a test session's runs); the block kills them
when it ends. Outside one, a run's kept actors die with the run.

The same shape: the same Ray options (CPU slots, cards, resources) and the same process
environment (the runtime env Ray starts it with), on one card: a multi-card engine holds its
placement group, which is released with its actor. Only an actor whose engine answered and shut
down cleanly is kept; one that failed is killed, as before. A kept actor still holds its Ray
resources, so before a target of another shape starts, every kept actor is killed: the cluster
never holds more than the scheduler's reservations account for.
"""

from __future__ import annotations

import contextlib
import json
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

Shape = str
_ACROSS_RUNS: ContextVar[IdleActors | None] = ContextVar("fleet_idle_actors_across_runs", default=None)


def shape(options: dict[str, Any]) -> Shape:
    """What must match for an actor process to be reused: its Ray options, runtime env included."""
    return json.dumps(options, sort_keys=True, default=str)


def _ray_session() -> str:
    """Which Ray the driver is connected to: a handle is good only there (a new local Ray numbers
    its jobs from 1 again, its node is new)."""
    import ray

    context = ray.get_runtime_context()
    return f"{context.get_node_id()}/{context.get_job_id()}"


class IdleActors:
    """Idle actors by Ray and shape: one run's, killed when it ends, or those of the runs in an
    `across_runs()` block."""

    def __init__(self) -> None:
        self.kept: dict[tuple[str, Shape], list[Any]] = {}
        _POOLS.add(self)

    def keep(self, key: Shape, handle: Any) -> None:
        self.kept.setdefault((_ray_session(), key), []).append(handle)

    def take(self, key: Shape) -> Any | None:
        """An idle actor of this shape, or None; with none, every idle actor this process keeps on
        this Ray (any run's, any block's) is killed, so that the new one finds their resources free."""
        here = (_ray_session(), key)
        if self.kept.get(here):
            return self.kept[here].pop()
        free_ray()
        return None

    def clear(self) -> None:
        """Kill the idle actors kept on the Ray the driver is connected to (those of a Ray since
        shut down went with it)."""
        import ray

        if not ray.is_initialized():
            self.kept.clear()
            return
        session = _ray_session()
        for where in [where for where in self.kept if where[0] == session]:
            for handle in self.kept.pop(where):
                with contextlib.suppress(Exception):  # already gone: nothing to kill
                    ray.kill(handle, no_restart=True)


_POOLS: weakref.WeakSet[IdleActors] = weakref.WeakSet()


def free_ray() -> None:
    """Kill every idle actor this process keeps on the Ray it is connected to (any run's, any
    block's): what starts next, a new actor, a placement group, another process's run, finds their
    resources free."""
    for pool in list(_POOLS):
        pool.clear()


def for_run(keep_actors: bool) -> tuple[IdleActors | None, bool]:
    """A run's idle actors (None: none kept, `run.keep_actors: false`) and whether the run owns
    them, killing them when it ends: it does, unless a `keeping()` block does."""
    shared = _ACROSS_RUNS.get()
    if shared is None:
        return (IdleActors() if keep_actors else None), True
    if not keep_actors:
        free_ray()  # what earlier runs kept would hold resources this run does not count
        return None, True
    return shared, False


@contextlib.contextmanager
def keeping(pool: IdleActors) -> Iterator[IdleActors]:
    """The runs in this block keep their actors in `pool`, whose owner kills them (`clear()`): a
    test session's pool, entered by each test that runs on the session's Ray."""
    token = _ACROSS_RUNS.set(pool)
    try:
        yield pool
    finally:
        _ACROSS_RUNS.reset(token)


@contextlib.contextmanager
def across_runs() -> Iterator[IdleActors]:
    """Keep actors between the runs made in this block, on one Ray: the next run's targets reuse
    the processes of the last one's of their shape. Idle actors hold their Ray resources until they
    are reused, a new actor starts, or the block ends. Inside another such block, it is that
    block's."""
    outer = _ACROSS_RUNS.get()
    if outer is not None:
        yield outer
        return
    pool = IdleActors()
    try:
        with keeping(pool):
            yield pool
    finally:
        pool.clear()
