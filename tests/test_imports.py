"""`import fleet` (and everything the driver loads) must not pull in torch, vllm or transformers."""

import subprocess
import sys

HEAVY = ("torch", "vllm", "transformers")


def test_driver_side_imports_are_light() -> None:
    code = (
        "import sys, fleet, fleet.cli, fleet.run.manifest, fleet.run.plan, fleet.run.driver, fleet.run.scheduler, "
        "fleet.results.store, fleet.analysis.parity, fleet.report.text, fleet.report.html, "
        "fleet.report.markdown, fleet.report.compare, actors, "
        "actors.target_actor, actors.sources;"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout.strip()}"
