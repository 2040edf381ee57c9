"""scripts/venv_install.py, `make setup`'s installer: pip's configuration, read by the venv's own pip,
becomes uv's flags; what uv cannot honour sends the install to pip. The install itself is what every
fresh clone's `make setup` (and CI) runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "venv_install.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("venv_install", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pips_files_and_variables_become_uvs_flags_the_variable_winning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nindex-url = https://mirror.example/simple\nfind-links = /from/global\n"
        "extra-index-url =\n    file:///a/simple\n    file:///b/simple\ncert = /ca.pem\n"
        "[install]\nfind-links = /from/install\n"
    )
    for name in [n for n in os.environ if n.startswith("PIP_")]:  # this machine's own (PIP_FIND_LINKS)
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))  # read after every other pip.conf
    monkeypatch.setenv("PIP_CONSTRAINT", "/c.txt")
    monkeypatch.setenv("PIP_TRUSTED_HOST", "mirror.example")
    script = _script()
    settings = script.pip_settings()
    assert settings["find-links"] == "/from/install"  # [install] over [global]
    assert settings["constraint"] == "/c.txt"
    monkeypatch.setenv("PIP_FIND_LINKS", "/from/env")
    settings = script.pip_settings()
    assert settings["find-links"] == "/from/env"  # a PIP_* variable over every file

    translated = script.uv_arguments(settings)
    assert not isinstance(translated, str), translated
    flags, env = translated
    pairs = list(zip(flags[::2], flags[1::2], strict=True))
    assert ("--index-strategy", "unsafe-best-match") in pairs  # versions picked across indexes as pip does
    assert ("--index-url", "https://mirror.example/simple") in pairs
    assert ("--extra-index-url", "file:///a/simple") in pairs and ("--extra-index-url", "file:///b/simple") in pairs
    assert ("--find-links", "/from/env") in pairs and ("--find-links", "/from/install") not in pairs
    assert ("--constraint", "/c.txt") in pairs and ("--allow-insecure-host", "mirror.example") in pairs
    assert env["SSL_CERT_FILE"] == "/ca.pem"


def test_a_setting_uv_cannot_honour_installs_with_pip_and_says_which(monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script()
    assert script.uv_arguments({"user": "1", "disable-pip-version-check": "1"}) == (
        "pip's setting user='1' has no uv counterpart here"
    )
    assert script.uv_arguments({"no-index": "true", "quiet": "1"}) == (
        ["--index-strategy", "unsafe-best-match", "--no-index"],
        {},
    )
    monkeypatch.setenv("FLEET_INSTALLER", "pip")
    assert script.uv_or_why() == "FLEET_INSTALLER=pip"


def test_without_a_verb_it_prints_its_use() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "venv_install.py install -e" in proc.stderr
