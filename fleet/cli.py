"""The `fleet` command: one subcommand per verb, the file first, then command-line overrides.

    fleet run MANIFEST [--set KEY=VALUE ...] | --resume RUN_DIR     run (or finish) a manifest, print the summary
    fleet report RUN_DIR|RUN_ID [--results ROOT] [--top N] [--html F] [--markdown F] [--gates F]
    fleet compare RUN_A RUN_B [--results ROOT] [--gates F]   (each a run directory or a run id)
    fleet runs [RESULTS_ROOT] [--trend METRIC [--html F]]   the runs there (id, status, models, targets,
                                                gates, started), or a perf figure across them
    fleet query RUN_DIR|RESULTS_ROOT "SQL" [--format table|csv|json] | --tables

    fleet run --check MANIFEST | --check --resume RUN_DIR   everything before Ray starts, nothing written
    fleet calibrate MANIFEST [--repeats N] [--mutation LABEL ...] [--healthy DIR]   mutants: the power table

Exit codes: 0 done (and every gate passed); 2 bad input (one message of at most 3 lines, no
traceback, nothing written); 3 the run finished but some model/target/shard failed (and no gate
failed); 4 a gate failed, partial run or not (a gate of an incomplete model/target fails); 1 a bug
in fleet-eval (its traceback, and a line saying so). 4 takes precedence over 3: a CI job that
treats 3 as "retry" must not retry a port whose gates failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.cli_args import EXIT_USAGE, MAX_LINE, parser

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleet.contracts.errors import StoreError
    from fleet.contracts.gates import Gate
    from fleet.report.model import RunReport

EXIT_OK, EXIT_PARTIAL, EXIT_GATES, EXIT_STORE = 0, 3, 4, 6
EXIT_INTERRUPT, EXIT_TERM = 130, 143  # 128 + SIGINT, SIGTERM: what a shell reports for a process they end
EXIT_MEANING = {
    ("run", EXIT_PARTIAL): "the run is partial (run.json names what failed) and no gate checks it",
    ("run", EXIT_GATES): "a gate failed",
    ("calibrate", EXIT_GATES): "the gates missed the calibration goal",
}
EXIT_MEANING |= {("report", code): why for (verb, code), why in EXIT_MEANING.items() if verb == "run"}


MAX_LINES = 3  # what a UserError may print (lines of at most MAX_LINE): the rest is cut


def main(argv: list[str] | None = None) -> int:
    """The one error boundary of every verb: a UserError is at most 3 short lines and exit 2; a
    StoreError (the results store refused a write) says where and how to resume, exit 6; any other
    exception is a bug, shown with its traceback, exit 1."""
    from fleet.contracts.errors import StoreError, UserError

    args = parser().parse_args(argv)
    try:
        verbs = {"run": _run, "calibrate": _calibrate, "report": _report, "compare": _compare, "runs": _runs}
        verbs["query"] = _query
        code = verbs[args.command](args)
    except UserError as e:
        print(user_message(e), file=sys.stderr)
        return EXIT_USAGE
    except StoreError as e:
        print(store_message(e), file=sys.stderr)
        print(f"fleet {args.command}: exit {EXIT_STORE}: the results store refused a write", file=sys.stderr)
        return EXIT_STORE
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM while a run goes (Stopped)
        from fleet.run.cluster import terminated

        stopped = terminated()  # Ray turns the handler's Stopped into its own KeyboardInterrupt
        print(interrupted_message(e, stopped=stopped), file=sys.stderr)
        return EXIT_TERM if stopped else EXIT_INTERRUPT
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001  (the boundary: anything else, Polars panics included, is a bug)
        traceback.print_exc()
        print(
            "error: this is a bug in fleet-eval (not in your input): please report it with the traceback above",
            file=sys.stderr,
        )
        return 1
    if (args.command, code) in EXIT_MEANING:  # a last line for wrappers that keep only 0 / not 0 (ray job submit)
        print(f"fleet {args.command}: exit {code}: {EXIT_MEANING[args.command, code]}", file=sys.stderr)
    return code


def interrupted_message(stop: KeyboardInterrupt, *, stopped: bool) -> str:
    """What Ctrl-C or SIGTERM (`stopped`) says: the run's committed shards are kept, and how to go on."""
    what = "stopped (SIGTERM)" if stopped else "interrupted"
    run_dir = getattr(stop, "run_dir", None)
    if run_dir is None:
        return what
    return f"{what}: the run's committed shards are kept; continue it with: fleet run --resume {run_dir}"


def store_message(error: StoreError) -> str:
    """What a refused write says: where, why, and how the run goes on."""
    from fleet.contracts.inputs import cut

    lines = [f"error: the results store refused a write: {cut(error.path, 200)}: {cut(error.reason, 200)}"]
    if error.run_dir is not None:
        lines.append("the run stops here, its committed shards kept; once the store takes writes again, continue it:")
        lines.append(f"fleet run --resume {error.run_dir}")
    return "\n".join(lines)


def user_message(error: Exception) -> str:
    """`error: ...` in at most MAX_LINES lines of at most MAX_LINE characters."""
    from fleet.contracts.inputs import cut

    lines = [cut(line, MAX_LINE) for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    if len(lines) > MAX_LINES:
        lines = [*lines[: MAX_LINES - 1], f"(and {len(lines) - MAX_LINES + 1} more lines)"]
    return "\n".join([f"error: {lines[0]}", *lines[1:]])


def _calibrate(args: argparse.Namespace) -> int:
    """The power table; exit 4 when the goal is missed (a mutant beyond precision passed, or a
    healthy copy failed)."""
    from fleet.report import calibrate, columns
    from fleet.report.table import markdown
    from fleet.run.check import default_run_id

    run_id = args.run_id or default_run_id(args.manifest.with_stem(f"{args.manifest.stem}-calibrate"))
    table, lines = calibrate.calibrate(
        args.manifest,
        results_dir=args.results,
        run_id=run_id,
        repeats=args.repeats,
        overrides=args.overrides,
        mutations=args.mutations,
        healthy_dir=args.healthy,
        mutants_dir=args.mutants,
    )
    print(markdown(table, columns.CALIBRATION))
    print("\n".join(f"- {line}" for line in lines))
    print(f"\nresults: {args.results}/{run_id}-healthy, {args.results}/{run_id}-mutants")
    return EXIT_GATES if any(line.startswith("goal MISSED") for line in lines) else EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from fleet.contracts.errors import UserError
    from fleet.results.catalog import record_verdict
    from fleet.run import driver

    common = {"ray_address": args.ray_address, "num_cpus": args.num_cpus}
    common |= {"progress": not args.no_progress, "verbose": args.verbose}
    if (args.manifest is None) == (args.resume is None):
        msg = "fleet run takes a MANIFEST or --resume RUN_DIR (one of them)"
        raise UserError(msg)
    if args.resume is not None and args.overrides:
        msg = "fleet run --resume takes no --set: a run finishes with the manifest it started with"
        raise UserError(msg)
    if args.check:
        return _check(args)
    from fleet.analysis.drilldown import points
    from fleet.report.drilldown import write_msprobe_configs
    from fleet.report.stages import gates_failed

    common["gates_of"] = gates_failed  # `after:` waits for the gates of the target it follows
    common["drilldown_of"] = points  # `drilldown:` probes the real divergences the analysis finds
    if args.resume is not None:
        run_dir, _ = driver.resume(args.resume, **common)
    else:
        run_dir, _ = driver.run(
            args.manifest, results_dir=args.results, run_id=args.run_id, overrides=args.overrides, **common
        )
    for path in write_msprobe_configs(run_dir):
        print(f"msprobe configuration: {path}")
    report, code = _summarize(run_dir)
    record_verdict(run_dir, {None: "none", True: "PASS", False: "FAIL"}[report.gates_passed])
    print(f"\nresults: {run_dir}")
    return code


def _check(args: argparse.Namespace) -> int:
    """`fleet run --check`: what run or resume would do before Ray starts, and what it found."""
    from fleet.run.check import check, check_resume

    if args.resume is not None:
        _, _, manifest, plans, unscored = check_resume(args.resume)
        shards, calls = sum(len(p.shards) for p in plans), sum(len(p.perf) + len(p.probes) for p in plans)
        scored = f" ({len(unscored)} of them stored unscored: to score only)" if unscored else ""
        print(f"ok: {args.resume}: {shards} shards{scored}, {calls} perf levels and probe calls to do")
        return EXIT_OK
    manifest, run_dir, _, unresolved = check(
        args.manifest, results_dir=args.results, run_id=args.run_id, overrides=args.overrides
    )
    print(f"ok: {len(manifest.models)} models x {len(manifest.targets)} targets would run into {run_dir}")
    return EXIT_PARTIAL if unresolved else EXIT_OK


def _library_defaults() -> None:
    """Settings of the libraries under a report, made before they load (nothing of the CLI has
    imported Polars or numpy yet); a user's own setting wins."""
    # Polars' allocator (jemalloc) keeps freed pages for reuse; a report is one pass that frees large
    # frames as it goes, so handing them back soon keeps its peak memory near its working set. At
    # 10M token rows: 0.2 s of decay 950 MB and 4.2 s, none 850 MB and 4.9 s, the default 1.2 GB
    # and 4.3 s.
    os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:200,muzzy_decay_ms:0")
    # numpy's OpenBLAS: the report's products are small (a chunk's dot products, a bootstrap's
    # matrices), and its worker threads spin between them on cores Polars needs: at 10M token rows
    # 7.5 % of the machine's samples were blas_thread_server (perf record, 2 cores); one thread
    # took the report's user CPU from 2.3-2.4 s to 1.9-2.1 s, its wall time the same.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _report(args: argparse.Namespace) -> int:
    _library_defaults()
    from fleet.analysis import gates

    for out in (args.html, args.markdown):
        if out is not None:
            _check_output(out)
    # The renderers asked for only (their imports cost a tenth of a second).
    outputs: list[tuple[Path, Callable[[RunReport], str]]] = []
    if args.html is not None:
        from fleet.report import html

        outputs.append((args.html, html.render_html))
    if args.markdown is not None:
        from fleet.report import markdown

        outputs.append((args.markdown, markdown.render_markdown))
    chosen = gates.load(args.gates) if args.gates else None
    report, code = _summarize(_run_dir(args.run_dir, args.results), chosen, top=args.top)
    for out, render in outputs:
        try:
            out.write_text(render(report), encoding="utf-8")
        except OSError as e:  # checked before the work, yet full, or a path no file can be made at
            from fleet.contracts.errors import UserError

            msg = f"{out}: cannot write it: {e.strerror or e}"
            raise UserError(msg) from None
        print(f"wrote {out}")
    return code


def _check_output(out: Path) -> None:
    """An output file the user named must be writable before any work (or printing) starts."""
    from fleet.contracts.errors import UserError
    from fleet.contracts.inputs import check_path_text, cut

    try:
        check_path_text(str(out))
        ok = out.parent.is_dir() and not out.is_dir()
    except (ValueError, OSError):
        ok = False
    if not ok:
        msg = f"{cut(str(out), 200)}: cannot write there (its folder must exist, and it must not be a folder)"
        raise UserError(msg)


def _run_dir(run: str, results: str) -> str:
    """A run directory as given, else the run of that id under the results root."""
    from fleet.contracts.errors import UserError
    from fleet.contracts.inputs import check_path_text, cut
    from fleet.results.catalog import is_run
    from fleet.results.store import join

    try:
        check_path_text(run)
        check_path_text(results)
    except ValueError as e:
        msg = f"{cut(run, 200)}: {e}"
        raise UserError(msg) from None
    try:
        if is_run(run):
            return run
        if "://" not in run and "/" not in run and is_run(candidate := str(join(results, run))):
            return candidate
    except OSError as e:  # a name too long for the file system, storage that does not answer
        msg = f"{cut(run, 200)}: cannot read it: {cut(str(e), 120)}"
        raise UserError(msg) from None
    msg = f"{cut(run, 200)}: not a run directory, nor a run id under {cut(results, 200)}"
    msg += f" (fleet runs {cut(results, 200)} lists them)"
    raise UserError(msg)


def _summarize(run_dir: str | Path, chosen: list[Gate] | None = None, *, top: int = 20) -> tuple[RunReport, int]:
    """Print the run's summary; the report (computed once, for every format) and the exit code."""
    from fleet.report import text
    from fleet.report.model import RunReport
    from fleet.report.status import StatusLine

    with StatusLine() as say:  # on a terminal, the step under way; erased before the report prints
        report = RunReport.build(run_dir, gates=chosen, top=top, say=say)
    print(text.render(report))
    if report.gates_passed is False:  # before partial: a failed gate is the verdict, whatever else failed
        return report, EXIT_GATES
    return report, EXIT_OK if report.complete else EXIT_PARTIAL


def _compare(args: argparse.Namespace) -> int:
    _library_defaults()
    from fleet.analysis import gates
    from fleet.report import compare
    from fleet.report.status import StatusLine

    chosen = gates.load(args.gates) if args.gates else None
    # Run ids resolve as in `fleet report` (one function, so the two verbs never drift apart).
    with StatusLine() as say:  # on a terminal, the step under way (each run's report in turn)
        a, b = (compare.report(_run_dir(run, args.results), say) for run in (args.run_a, args.run_b))
    print(compare.render(compare.compare(a, b, gates=chosen), run_a=a, run_b=b))
    return EXIT_OK


def _runs(args: argparse.Namespace) -> int:
    from fleet.contracts.errors import UserError
    from fleet.results import catalog

    if args.trend is None:
        if args.html is not None:
            msg = "fleet runs --html draws a trend: add --trend METRIC (e.g. --trend perf_output_tok_s)"
            raise UserError(msg)
        print(catalog.render_runs(catalog.runs(args.results_root)))
        return EXIT_OK
    from fleet.analysis.trend import check_metric, trend
    from fleet.report.trend import render_html, render_text

    check_metric(args.trend)
    if args.html is not None:
        _check_output(args.html)
    frame = trend(args.results_root, args.trend)
    print(render_text(frame, args.trend, results_root=args.results_root))
    if args.html is not None:
        args.html.write_text(render_html(frame, args.trend, results_root=args.results_root), encoding="utf-8")
        print(f"wrote {args.html}")
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
