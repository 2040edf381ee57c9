"""The `fleet` command: one subcommand per verb, the file first, then command-line overrides.

    fleet run MANIFEST [--set KEY=VALUE ...] | --resume RUN_DIR     run (or finish) a manifest, print the summary
    fleet report RUN_DIR [--html F] [--markdown F] [--gates F]
    fleet compare RUN_A RUN_B [--gates F]
    fleet query RUN_DIR "SQL" [--format table|csv|json] | --tables

Exit codes: 0 done (and every gate passed); 2 bad input (one message, no traceback, nothing
written); 3 the run finished but some model/target/shard failed; 4 a gate failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleet.contracts.gates import Gate
    from fleet.report.model import RunReport

EXIT_OK, EXIT_USAGE, EXIT_PARTIAL, EXIT_GATES = 0, 2, 3, 4


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleet", description="Parity and performance of LLM serving targets vs a reference."
    )
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a manifest, write Parquet results, print the summary")
    run.add_argument("manifest", type=Path, nargs="?", help="manifest YAML file")
    run.add_argument("--resume", metavar="RUN_DIR", help="finish an interrupted run: only missing shards")
    # Run directories are strings, not Paths: pathlib would turn s3://bucket/x into s3:/bucket/x.
    run.add_argument(
        "--results", default="results", help="where run directories go (default: results; or s3://bucket/prefix)"
    )
    run.add_argument("--run-id", help="run directory name (default: <manifest stem>-<UTC time>)")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="KEY=VALUE",
        help="override a manifest field after reading the file (dotted path, YAML value), e.g. "
        "sampling.max_tokens=4 or perf.0.concurrency=[1]; repeatable",
    )
    run.add_argument("--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else start a local Ray)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--verbose", action="store_true", help="show actor and engine logs")

    report = sub.add_parser("report", help="recompute and print the summary from a run directory's Parquet files")
    report.add_argument(
        "run_dir", help="a run directory (results/<run_id>, or a URI such as s3://bucket/prefix/<run_id>)"
    )
    report.add_argument("--html", type=Path, metavar="OUT", help="also write a self-contained HTML report")
    report.add_argument("--markdown", type=Path, metavar="OUT", help="also write a Markdown report")
    report.add_argument("--gates", type=Path, metavar="FILE", help="gates YAML (default: the run's manifest gates)")

    compare = sub.add_parser("compare", help="the same model x target in two runs side by side")
    compare.add_argument("run_a")
    compare.add_argument("run_b")
    compare.add_argument("--gates", type=Path, metavar="FILE", help="gates YAML: show verdict changes")

    query = sub.add_parser("query", help="SQL over a run's tables (requests, tokens, shards, parity, ...)")
    query.add_argument("run_dir")
    query.add_argument("sql", nargs="?", help="a SQL query (Polars SQL)")
    query.add_argument("--format", choices=["table", "csv", "json"], default="table")
    query.add_argument("--tables", action="store_true", help="list the tables and their columns")
    return p


def main(argv: list[str] | None = None) -> int:
    from fleet.contracts.errors import UserError

    args = _parser().parse_args(argv)
    try:
        return {"run": _run, "report": _report, "compare": _compare, "query": _query}[args.command](args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    from fleet.contracts.errors import UserError
    from fleet.run import driver

    common = {"ray_address": args.ray_address, "progress": not args.no_progress, "verbose": args.verbose}
    if (args.manifest is None) == (args.resume is None):
        msg = "fleet run takes a MANIFEST or --resume RUN_DIR (one of them)"
        raise UserError(msg)
    if args.resume is not None and args.overrides:
        msg = "fleet run --resume takes no --set: a run finishes with the manifest it started with"
        raise UserError(msg)
    if args.resume is not None:
        run_dir, _ = driver.resume(args.resume, **common)
    else:
        run_dir, _ = driver.run(
            args.manifest, results_dir=args.results, run_id=args.run_id, overrides=args.overrides, **common
        )
    _, code = _summarize(run_dir)
    print(f"\nresults: {run_dir}")
    return code


def _report(args: argparse.Namespace) -> int:
    from fleet.analysis import gates
    from fleet.report import html, markdown

    chosen = gates.load(args.gates) if args.gates else None
    report, code = _summarize(args.run_dir, chosen)
    for out, render in ((args.html, html.render_html), (args.markdown, markdown.render_markdown)):
        if out is not None:
            out.write_text(render(report), encoding="utf-8")
            print(f"wrote {out}")
    return code


def _summarize(run_dir: str | Path, chosen: list[Gate] | None = None) -> tuple[RunReport, int]:
    """Print the run's summary; the report (computed once, for every format) and the exit code."""
    from fleet.report import text
    from fleet.report.model import RunReport

    report = RunReport.build(run_dir, gates=chosen)
    print(text.render(report))
    if not report.complete:
        return report, EXIT_PARTIAL
    return report, EXIT_GATES if report.gates_passed is False else EXIT_OK


def _compare(args: argparse.Namespace) -> int:
    from fleet.analysis import gates
    from fleet.report import compare

    chosen = gates.load(args.gates) if args.gates else None
    a, b = compare.report(args.run_a), compare.report(args.run_b)
    print(compare.render(compare.compare(a, b, gates=chosen), run_a=a, run_b=b))
    return EXIT_OK


def _query(args: argparse.Namespace) -> int:
    from fleet.analysis import query
    from fleet.contracts.errors import UserError

    if args.tables:
        print(query.describe(args.run_dir))
        return EXIT_OK
    if not args.sql:
        msg = 'fleet query needs a SQL string (or --tables), e.g. "SELECT * FROM requests LIMIT 5"'
        raise UserError(msg)
    print(query.render(query.query(args.run_dir, args.sql), fmt=args.format))
    return EXIT_OK
