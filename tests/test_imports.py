"""`import fleet` (and everything the driver loads) must not pull in torch, vllm or transformers."""

import subprocess
import sys

HEAVY = ("torch", "vllm", "transformers")


def test_driver_side_imports_are_light() -> None:
    code = (
        "import sys, fleet, fleet.cli, fleet.manifest, fleet.plan, fleet.driver, fleet.scheduler, "
        "fleet.store, fleet.analysis, fleet.report, actors, actors.card;"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout.strip()}"
