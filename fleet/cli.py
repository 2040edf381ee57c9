"""`fleet run MANIFEST` and `fleet report RUN_DIR`: one subcommand per verb.

Exit codes: 0 all targets completed; 2 bad input (one message, no traceback, nothing written);
3 the run finished but some model/target failed (run.json and the report say which).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_OK, EXIT_USAGE, EXIT_PARTIAL = 0, 2, 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleet", description="Parity and performance of LLM serving targets vs a reference."
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a manifest, write Parquet results, print the summary")
    run.add_argument("manifest", type=Path, help="manifest YAML file")
    run.add_argument(
        "--results", type=Path, default=Path("results"), help="where run directories go (default: results)"
    )
    run.add_argument("--run-id", help="run directory name (default: <manifest stem>-<UTC time>)")
    run.add_argument("--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else start a local Ray)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--verbose", action="store_true", help="show actor and engine logs")
    report = sub.add_parser("report", help="recompute and print the summary from a run directory's Parquet files")
    report.add_argument("run_dir", type=Path, help="a run directory (results/<run_id>)")
    return p


def main(argv: list[str] | None = None) -> int:
    from fleet.errors import UserError

    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        return _report(args.run_dir)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    from fleet import driver

    run_dir, outcome = driver.run(
        args.manifest,
        results_dir=args.results,
        run_id=args.run_id,
        ray_address=args.ray_address,
        progress=not args.no_progress,
        verbose=args.verbose,
    )
    code = _report(run_dir)
    print(f"\nresults: {run_dir}")
    return EXIT_PARTIAL if outcome.failures else code


def _report(run_dir: Path) -> int:
    from fleet import report

    text, complete = report.render(run_dir)
    print(text)
    return EXIT_OK if complete else EXIT_PARTIAL
