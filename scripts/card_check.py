"""Run the demo-sized check on one real card: `python scripts/card_check.py --device npu` (or cuda).

vLLM bfloat16 on the card against transformers float32 on the card's host CPU, plus one decode
perf level (manifests/card.yaml), in vLLM's default process layout for the card. It first prints
what it needs and what it found; on a machine without the card it says so and exits 0 (skipped),
with the card but without the packages it exits 1 naming what to install. Everything else is
`fleet run`, whose exit code it returns.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# device -> (the device nodes a card shows on its host, the packages its engine needs beside fleet's own)
NEEDS = {
    "npu": ("/dev/davinci[0-9]*", ("vllm", "vllm-ascend", "torch", "torch-npu", "transformers")),
    "cuda": ("/dev/nvidia[0-9]*", ("vllm", "torch", "transformers")),
}
INSTALL = {"npu": "pip install -e '.[ascend]' (docs/atlas-800.md)", "cuda": "pip install -e '.[cuda]'"}


def cards(device: str) -> list[str]:
    """The device nodes of this host's cards (none without a card, its driver or, in a container,
    the --device mounts of docs/atlas-800.md)."""
    return sorted(str(p) for p in Path("/dev").glob(NEEDS[device][0].removeprefix("/dev/")))


def versions(packages: tuple[str, ...]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=sorted(NEEDS), required=True)
    parser.add_argument("--results", default=str(ROOT / "results"), help="results root (default: results/)")
    args = parser.parse_args(argv)
    _, packages = NEEDS[args.device]
    print(f"card_check needs: one {args.device} card with its driver; packages {', '.join(packages)}")
    found_cards, found = cards(args.device), versions(packages)
    print(f"  cards found: {', '.join(found_cards) or 'none'}")
    print("  packages: " + ", ".join(f"{k} {v or 'MISSING'}" for k, v in found.items()))
    if not found_cards:
        print(f"skipped: no {args.device} card on this machine")
        return 0
    if missing := [k for k, v in found.items() if v is None]:
        print(f"cannot run: missing {', '.join(missing)}; install with {INSTALL[args.device]}")
        return 1
    cmd = [sys.executable, "-m", "fleet", "run", str(ROOT / "manifests" / "card.yaml"), "--results", args.results]
    cmd += ["--set", f"targets.1.device={args.device}"]
    print("running: " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
