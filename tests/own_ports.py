"""Ports of a test's own: a free loopback port, and a Ray head of its own (`ray start --head
--block`) on ports no other Ray of the machine holds (the session's Rays already hold the agents'
default ones, 52365...)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def head_command(port: int) -> list[str]:
    """`ray start --head --block` on `port` with 2 CPUs; the caller adds its dashboard flags.
    SIGTERM to it stops that cluster (`ray stop` would stop every Ray of the machine)."""
    cmd = [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--disable-usage-stats"]
    cmd += [f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}"]
    return [*cmd, f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]
