"""A pytest plugin: how `make test` deals the suite to its two pytest-xdist workers.

A work unit runs whole on one worker; units go to workers in collection order as they free up.
- A module with module-scoped fixtures (a server, an engine run) is one unit: they are built once.
- Tests on a costly shared session fixture (`engine_run`) form one unit, wherever their module is.
- Any other test is a unit of its own, so a long module (the seed reports) spreads over both.
Engine units are collected first: the short ones then fill the end, instead of one engine unit
running alone at the end; units with an `alone` test come last of all. xdist's own `loadgroup`
marks cannot do this on pytest 9: xdist renames nodes through an attribute pytest 9 dropped, so
the marks are silently lost."""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
# Session fixtures too costly to build once per worker.
SHARED_FIXTURES = frozenset({"engine_run"})


@functools.cache
def _module(path: str) -> tuple[bool, bool, frozenset[str]]:
    """(has module-scoped fixtures, they use a shared fixture, test functions using a shared fixture)."""
    tree = ast.parse((ROOT / path).read_text())
    module_scoped, module_shares, sharing = False, False, set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = {a.arg for a in node.args.args + node.args.kwonlyargs}
        scoped = any("scope" in ast.unparse(d) and "module" in ast.unparse(d) for d in node.decorator_list)
        module_scoped |= scoped
        if args & SHARED_FIXTURES:
            module_shares |= scoped
            sharing.add(node.name)
    return module_scoped, module_shares, frozenset(sharing)


def work_unit(nodeid: str) -> str:
    path, _, name = nodeid.partition("::")
    module_scoped, module_shares, sharing = _module(path)
    if module_shares or name.split("[")[0] in sharing:
        return "shared session fixture"
    return path if module_scoped else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `--dist loadscope` (the Makefile's), xdist's scopes become our work units."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Engine units first; units holding an `alone` test (tests/alone.py) last, when what the other
    worker is running, and so what they wait for, is short: in the middle it was a 5-minute engine
    unit, a worker idle all that time."""
    engine = {work_unit(item.nodeid) for item in items if item.get_closest_marker("engine")}
    alone = {work_unit(item.nodeid) for item in items if item.get_closest_marker("alone")}
    items.sort(key=lambda item: (work_unit(item.nodeid) in alone, work_unit(item.nodeid) not in engine))
