"""`make setup`'s installer: uv where pip's configuration carries over to it, pip otherwise.

    .venv/bin/python scripts/venv_install.py install -e '.[cpu,dev]'
    .venv/bin/python scripts/venv_install.py uninstall torchvision torchaudio

pip spent ~2 min of `make setup` on one core, most of it unpacking and byte-compiling ~35k files;
uv installs the same versions, byte-compiled, in under a minute (docs/measurements.md, "make setup
with uv"). The bytecode is compiled here because a process that finds none compiles what it imports
each time it starts where PYTHONDONTWRITEBYTECODE is set: `import vllm` 20 s instead of 9 s.

uv reads none of pip's configuration, so pip's own view of it (`pip config list`: pip.conf files
and PIP_* variables) is handed to uv as flags and variables, and uv is told to pick versions across
indexes the way pip does. A setting with no counterpart here, uv missing from the index, or
`FLEET_INSTALLER=pip` makes this install with pip as before, saying why.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
UV = Path(sys.executable).parent / "uv"
# pip's settings that change nothing uv would do here (output, caching, pip's own checks).
IGNORED = {
    "cache-dir",
    "config-file",  # where the settings were read from: read already
    "disable-pip-version-check",
    "exists-action",
    "log",
    "no-cache-dir",
    "no-color",
    "no-input",
    "progress-bar",
    "quiet",
    "retries",
    "root-user-action",
    "verbose",
}
# pip setting -> uv flag, once per value (pip writes lists space- or newline-separated).
FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
    "no-binary": "--no-binary",
    "only-binary": "--only-binary",
}
# pip setting -> the variable uv (or the TLS and proxy layers under it) reads.
VARIABLES = {
    "cert": "SSL_CERT_FILE",
    "client-cert": "SSL_CLIENT_CERT",
    "proxy": "ALL_PROXY",
    "timeout": "UV_HTTP_TIMEOUT",
    "default-timeout": "UV_HTTP_TIMEOUT",
}
SCOPES = ("global", "install", ":env:")  # pip's precedence for `pip install`: later wins
LINE = re.compile(r"^(?P<scope>[^.]+)\.(?P<key>[^=]+)=(?P<value>'.*'|\".*\")$")  # pip prints repr(value)


def pip_settings() -> dict[str, str]:
    """pip's settings as `pip install` sees them: key -> value, the strongest scope's."""
    listed = subprocess.run([*PIP, "config", "list"], capture_output=True, text=True)
    if listed.returncode:
        raise OSError(f"pip config list failed: {listed.stderr.strip()}")
    found: dict[str, dict[str, str]] = {}
    for line in listed.stdout.splitlines():
        if (m := LINE.match(line)) and m["scope"] in SCOPES:
            found.setdefault(m["key"], {})[m["scope"]] = ast.literal_eval(m["value"])
    return {key: next(by[s] for s in reversed(SCOPES) if s in by) for key, by in found.items()}


def uv_arguments(settings: dict[str, str]) -> tuple[list[str], dict[str, str]] | str:
    """uv's flags and environment for pip's `settings`, or why uv cannot honour them."""
    flags, env = ["--index-strategy", "unsafe-best-match"], {}
    for key, value in sorted(settings.items()):
        if key in FLAGS:
            flags += [x for v in value.split() for x in (FLAGS[key], v)]
        elif key in VARIABLES:
            env[VARIABLES[key]] = value
        elif key == "pre" and value.lower() in ("1", "true", "yes", "on"):
            flags += ["--prerelease", "allow"]
        elif key == "no-index" and value.lower() in ("1", "true", "yes", "on"):
            flags.append("--no-index")
        elif key not in IGNORED:
            return f"pip's setting {key}={value!r} has no uv counterpart here"
    return flags, env


def uv_or_why() -> tuple[list[str], dict[str, str]] | str:
    """uv's flags and environment, or why this installs with pip."""
    if os.environ.get("FLEET_INSTALLER", "uv") == "pip":
        return "FLEET_INSTALLER=pip"
    try:
        translated = uv_arguments(pip_settings())
    except OSError as e:  # pip's configuration unreadable: pip itself will say more
        return str(e)
    if isinstance(translated, str):
        return translated
    if not UV.exists():
        got = subprocess.run([*PIP, "install", "--quiet", "uv>=0.9"], capture_output=True, text=True)
        if got.returncode:
            return "uv could not be installed: " + (got.stderr.strip().splitlines() or ["pip gave no reason"])[-1]
    return translated


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("install", "uninstall"):
        print(__doc__, file=sys.stderr)
        return 2
    verb, args = argv[0], argv[1:]
    uv = uv_or_why()
    if isinstance(uv, str):
        print(f"venv_install: using pip, not uv: {uv}", file=sys.stderr)
        if verb == "install":
            subprocess.run([*PIP, "install", "--quiet", "--upgrade", "pip"], check=True)
            return subprocess.run([*PIP, "install", "--quiet", *args]).returncode
        return subprocess.run([*PIP, "uninstall", "--quiet", "-y", *args]).returncode
    flags, env = uv
    cmd = [str(UV), "pip", verb, "--quiet", "--python", sys.executable]
    if verb == "install":
        # pip itself stays current, as `pip install --upgrade pip` kept it: fleet runs `pip download`.
        cmd += ["--compile-bytecode", *flags, "--upgrade-package", "pip", "pip"]
    return subprocess.run([*cmd, *args], env=os.environ | env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
