"""Where a command's CPU goes, by kind of process: run it (the test suite, say) while every process's
user + system time is read from /proc, then print the machine's busy share and a table by kind.

    .venv/bin/python benchmarks/suite_cpu.py [--every 0.5] -- .venv/bin/pytest -n 2 --dist loadscope

Every process alive at a sample is counted with the last CPU time seen, so one living less than
`--every` is missed, and the command's whole process tree is not separated from the rest of the
machine (a kernel thread's time shows as such): run it on an otherwise idle machine. Linux only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
# (kind, words any of which in a command line or a thread's name mark it), first match wins.
KINDS = [
    ("vLLM engine core / TP rank", ("EngineCore", "VLLM::Worker", "VllmWorker")),
    ("fleet target actor (ray::TargetActor)", ("ray::TargetActor",)),
    ("other Ray actor or task", ("ray::",)),
    ("vLLM OpenAI server", ("entrypoints.openai.api_server",)),
    ("vLLM model-registry inspection", ("model_executor.models.registry",)),
    ("Ray's own (raylet, GCS, agents, workers)", ("raylet", "gcs_server", "dashboard", "/ray/", "default_worker")),
    ("pytest (and xdist workers)", ("pytest",)),
    ("compilers", ("cc1plus", "/usr/bin/ld", "gcc")),
    ("chromium", ("chromium",)),
]


def kind(cmdline: str, comm: str) -> str:
    for name, words in KINDS:
        if any(w in cmdline for w in words):
            return name
    return f"kernel thread {comm}" if not cmdline else "other: " + cmdline.split()[0].rsplit("/", 1)[-1]


def busy_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of the whole machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


def sample(seen: dict[tuple[str, str], tuple[float, str, str]], skip: int) -> None:
    """Each process's CPU so far and its latest command line: a Ray worker's changes when it becomes
    an actor (`ray::TargetActor`), so the kind is decided at the end, from the last one seen."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == skip:
            continue
        try:
            comm, rest = Path(entry.path, "stat").read_text().rsplit(")", 1)
            fields = rest.split()
            cpu = (int(fields[11]) + int(fields[12])) / HZ
            key = (entry.name, fields[19])  # pid and start time: a reused pid is another process
            if key in seen and cpu <= seen[key][0]:
                continue
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            seen[key] = (cpu, cmdline or seen.get(key, (0.0, "", ""))[1], comm.split("(", 1)[1])
        except (OSError, IndexError, ValueError):
            continue  # gone between the listing and the read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    seen: dict[tuple[str, str], tuple[float, str, str]] = {}
    sample(seen, os.getpid())
    before = dict(seen)
    start, t0 = busy_ticks(), time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        sample(seen, os.getpid())
        time.sleep(args.every)
    sample(seen, os.getpid())
    wall, end = time.monotonic() - t0, busy_ticks()
    by_kind: defaultdict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for key, (cpu, cmdline, comm) in seen.items():
        cpu -= before.get(key, (0.0, "", ""))[0]  # only what was used while the command ran
        name = kind(cmdline, comm)
        if cpu > 0:
            by_kind[name] += cpu
            count[name] += 1
    busy, total = (end[0] - start[0]) / HZ, (end[1] - start[1]) / HZ
    print(f"\n{' '.join(command)}: exit {proc.returncode}, {wall:.0f} s wall")
    print(f"machine busy {busy:.0f} CPU s of {total:.0f} ({100 * busy / max(total, 1e-9):.0f} %)")
    print(f"{'CPU s':>8} {'share':>6} {'procs':>6}  kind")
    for name, cpu in sorted(by_kind.items(), key=lambda kv: -kv[1])[:20]:
        print(f"{cpu:8.1f} {100 * cpu / max(busy, 1e-9):5.0f}% {count[name]:6d}  {name}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
