"""What an idle local Ray costs, with and without prestarted workers: the CPU seconds of every Ray
process of a fresh `ray.init(address="local", num_cpus=2)` (as the suite's) over a window in which
nothing is asked of it, once as Ray defaults and once with `RAY_prestart_worker_first_driver=0`
(tests/conftest.py sets it for the suite's Rays), each in a fresh process. Linux (/proc).

    .venv/bin/python benchmarks/ray_idle.py [--seconds 45]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {"Ray's default": {}, "RAY_prestart_worker_first_driver=0": {"RAY_prestart_worker_first_driver": "0"}}


def ticks() -> dict[str, tuple[int, str]]:
    """pid -> (CPU clock ticks so far, what it is) of every Ray process."""
    out = {}
    for proc in Path("/proc").iterdir():
        pid = proc.name
        if not pid.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if "ray" in args:
            name = args.split()[0].rsplit("/", 1)[-1] if not args.startswith("ray::") else args.split()[0]
            out[pid] = (int(stat[11]) + int(stat[12]), name)
    return out


def one(seconds: float) -> dict[str, float]:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    time.sleep(8)  # its start settled
    me = str(os.getpid())
    before = ticks()
    time.sleep(seconds)
    after = ticks()
    ray.shutdown()
    per: dict[str, float] = {}
    for pid, (t, name) in after.items():
        if pid != me:
            per[name] = per.get(name, 0.0) + (t - before.get(pid, (0, ""))[0]) / os.sysconf("SC_CLK_TCK")
    return per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.one:
        print(json.dumps(one(args.seconds)))
        return
    command = " ".join(sys.argv)
    print(f"an idle local Ray (num_cpus=2), CPU s of its processes over {args.seconds:.0f} s; command: {command}")
    for label, env in SETTINGS.items():
        out = subprocess.run(
            [sys.executable, __file__, "--one", "--seconds", str(args.seconds)],
            env=os.environ | env,
            capture_output=True,
            text=True,
            check=True,
        )
        per = json.loads(out.stdout.strip().splitlines()[-1])
        parts = ", ".join(f"{name} {cpu:.2f}" for name, cpu in sorted(per.items(), key=lambda x: -x[1]) if cpu >= 0.01)
        total = sum(per.values())
        print(f"  {label}: {total:.2f} CPU s ({total / args.seconds:.1%} of a core): {parts}", flush=True)


if __name__ == "__main__":
    main()
