"""The `fleet` command line: its verbs and flags (the verbs themselves are in fleet/cli.py).

Every numeric flag is `Bounded`: a value out of its range is a usage error, exit 2, before any verb
runs. tests/test_cli_flags.py walks every subparser and checks that no numeric flag is unbounded.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

EXIT_USAGE = 2
MAX_LINE = 400  # a usage error is one line of about this length
MAX_TOP = 100_000  # rows per per-prompt table: past this the report is a dump (fleet query lists them all)


class Bounded:
    """An argparse `type`: a number in [lo, hi]. Out of range or not a number is argparse's own usage
    error (exit 2, one line naming the flag, the value and the range); a bare `type=int` would let
    `--top -3` reach the report and fail there with a traceback."""

    def __init__(self, kind: type[int] | type[float], lo: float, hi: float) -> None:
        self.kind, self.lo, self.hi = kind, lo, hi
        self.expected = f"{'an integer' if kind is int else 'a number'} from {lo:g} to {hi:g}"

    def __call__(self, text: str) -> int | float:
        from fleet.contracts.inputs import clip

        try:
            value = self.kind(text)
        except (ValueError, OverflowError):
            value = None
        if value is None or not (self.lo <= value <= self.hi):  # NaN compares false: refused too
            raise argparse.ArgumentTypeError(f"{clip(text, 40)}: expected {self.expected}")
        return value

    def __repr__(self) -> str:  # argparse names the type in some messages
        return f"Bounded({self.kind.__name__}, {self.lo:g}, {self.hi:g})"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (its own wraps the whole usage over many)."""

    def error(self, message: str) -> NoReturn:
        from fleet.contracts.inputs import cut

        self.exit(EXIT_USAGE, f"{self.prog}: error: {cut(message, MAX_LINE)} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="fleet", description="Parity and performance of LLM serving targets vs a reference.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    run = sub.add_parser("run", help="run a manifest, write Parquet results, print the summary")
    run.add_argument("manifest", type=Path, nargs="?", help="manifest YAML file")
    run.add_argument("--resume", metavar="RUN_DIR", help="finish an interrupted run: missing and unscored shards")
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
    run.add_argument(
        "--num-cpus",
        type=Bounded(int, 1, 1024),
        metavar="N",
        help="CPU slots of the private local Ray (default: the machine's cores; more oversubscribes them)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--verbose", action="store_true", help="show actor and engine logs")
    run.add_argument(
        "--check", action="store_true", help="validate everything that is checked before Ray starts; write nothing"
    )

    cal = sub.add_parser("calibrate", help="run mutants of each vllm candidate: which gates catch a broken port")
    cal.add_argument("manifest", type=Path, help="manifest YAML file (its gates are measured)")
    cal.add_argument("--results", default="results", help="where the two run directories go (default: results)")
    cal.add_argument("--run-id", help="run directory prefix (default: <manifest stem>-calibrate-<UTC time>)")
    cal.add_argument(
        "--repeats",
        type=Bounded(int, 1, 10),
        default=3,
        metavar="N",
        help="healthy copies of each candidate (default 3)",
    )
    cal.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE", help="as in run")
    cal.add_argument(
        "--mutation",
        action="append",
        default=[],
        dest="mutations",
        metavar="LABEL",
        help="run only this mutant, e.g. 'rope base x0.8' or rope-base-x0.8; repeatable (default: all)",
    )
    cal.add_argument("--healthy", metavar="RUN_DIR", help="reuse this finished healthy run instead of running it")
    cal.add_argument("--mutants", metavar="RUN_DIR", help="reuse this finished mutants run instead of running it")

    report = sub.add_parser("report", help="recompute and print the summary from a run directory's Parquet files")
    report.add_argument(
        "run_dir",
        help="a run directory (results/<run_id>, or a URI: s3://bucket/prefix/<run_id>), or a run id under --results",
    )
    report.add_argument("--results", default="results", help="where to look up a run id (default: results)")
    report.add_argument(
        "--top",
        type=Bounded(int, 1, MAX_TOP),
        default=20,
        metavar="N",
        help="per-prompt tables: the worst N per target (default 20)",
    )
    report.add_argument("--html", type=Path, metavar="OUT", help="also write a self-contained HTML report")
    report.add_argument("--markdown", type=Path, metavar="OUT", help="also write a Markdown report")
    report.add_argument("--gates", type=Path, metavar="FILE", help="gates YAML (default: the run's manifest gates)")

    compare = sub.add_parser("compare", help="the same model x target in two runs side by side")
    compare.add_argument("run_a", help="a run directory, or a run id under --results")
    compare.add_argument("run_b", help="a run directory, or a run id under --results")
    compare.add_argument("--results", default="results", help="where to look up run ids (default: results)")
    compare.add_argument("--gates", type=Path, metavar="FILE", help="gates YAML: show verdict changes")

    runs = sub.add_parser("runs", help="list the runs under a results root")
    runs.add_argument("results_root", nargs="?", default="results", help="default: results")
    runs.add_argument(
        "--trend",
        metavar="METRIC",
        help="a perf figure across the runs, per model, target, scenario and level (e.g. perf_output_tok_s)",
    )
    runs.add_argument("--html", type=Path, metavar="OUT", help="with --trend: also write the plot as an HTML page")

    query = sub.add_parser("query", help="SQL over a run's tables, or every run's under a results root")
    query.add_argument("run_dir", help="a run directory, or a results root (its tables stacked on run_id)")
    query.add_argument("sql", nargs="?", help="a SQL query (Polars SQL)")
    query.add_argument("--format", choices=["table", "csv", "json"], default="table")
    query.add_argument("--tables", action="store_true", help="list the tables and their columns")
    return p
