"""A pytest plugin: tests marked `alone` run with no other test running, under pytest-xdist.

`make test` runs two workers side by side (Makefile). A test that compares timings (a 5 % slower
stream must fail a gate, a healthy repeat must pass) measures the other worker's load as much as its
own. Every test holds a shared lock while it runs; an `alone` test holds it exclusively, so it waits
for the other worker's current test and the other worker waits for it. A turnstile lock taken
before either gives the exclusive request its turn: readers cannot keep it out forever.
Without xdist there is one test at a time and no lock is taken."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _one_at_a_time_when_alone(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    shared = tmp_path_factory.getbasetemp().parent  # the same directory for every worker of a session
    alone = request.node.get_closest_marker("alone") is not None
    with ExitStack() as held:
        with _flock(shared / "turnstile.lock", fcntl.LOCK_EX):
            held.enter_context(_flock(shared / "tests.lock", fcntl.LOCK_EX if alone else fcntl.LOCK_SH))
        yield
