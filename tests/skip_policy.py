"""A pytest plugin: with FLEET_CI_NO_SKIPS=1 (set by .ci/run) a skip is a failure unless the
allow-list (.ci/allowed-skips, or $FLEET_CI_ALLOWED_SKIPS) names the test and the reason.

On a fresh machine every test must run; a skip ("chromium not installed", "preflight failed")
hides exactly what CI is there to prove. tests/conftest.py loads the hook from here.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ALLOW_LIST = Path(__file__).parents[1] / ".ci" / "allowed-skips"


def allow_list(text: str) -> list[tuple[str, re.Pattern[str]]]:
    """(test id pattern, reason pattern) per entry; every entry must say why it is allowed."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in line.split(" | ")]
        if len(fields) != 3 or not all(fields):
            msg = f"allowed skips line {number}: expected 'test pattern | reason pattern | why', got {line!r}"
            raise ValueError(msg)
        entries.append((fields[0], re.compile(fields[1])))
    return entries


def allowed(nodeid: str, reason: str, entries: list[tuple[str, re.Pattern[str]]]) -> bool:
    return any(fnmatch.fnmatchcase(nodeid, test) and pattern.search(reason) for test, pattern in entries)


def _reason(report: pytest.TestReport) -> str:
    longrepr: Any = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return str(text).removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("FLEET_CI_NO_SKIPS") != "1" or not report.skipped or hasattr(report, "wasxfail"):
        return
    path = Path(os.environ.get("FLEET_CI_ALLOWED_SKIPS") or ALLOW_LIST)
    reason = _reason(report)
    if not allowed(report.nodeid, reason, allow_list(path.read_text(encoding="utf-8"))):
        report.outcome = "failed"
        report.longrepr = f"skipped, and not on the allow-list {path}: {reason}"
