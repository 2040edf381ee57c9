"""The run summary `fleet run` and `fleet report` print, recomputed from a run directory's Parquet
files and run.json alone (fleet.report.model).

It is Markdown, so a summary pastes straight into an adaptation report: the verdict and the summary
table first (fleet.report.summary), then every standard section (fleet.report.sections) in its order
(after the seed report's own sections, fleet.report.layouts, when the manifest names a layout), each
table whole, long cells cut at TEXT_CELL characters.
"""

from __future__ import annotations

from fleet.report import markdown, summary
from fleet.report.layouts import seed_sections
from fleet.report.model import RunReport
from fleet.report.sections import sections

TEXT_CELL = 80  # characters of a cell (generated text) before it is cut with …


def render(report: RunReport) -> str:
    """The summary text of `report`: header, notices, verdict and summary table, then every section."""
    info = report.info
    out = [
        f"# fleet-eval run {report.run_id}",
        "",
        f"status: {info.status}  started: {info.started_at}  finished: {info.finished_at}",
        f"manifest: {info.manifest_path} (sha256 {(info.manifest_sha256 or '')[:12]})",
        f"reference: {report.reference}",
    ]
    out += ["", *(f"- {notice}" for notice in report.notices)] if report.notices else []
    first = summary.section(report)
    out += ["", f"## {first.title}", "", report.verdict_line]
    out += ["", *markdown.blocks(first.blocks, level=3, limit=None, max_chars=TEXT_CELL)]
    if (seed := seed_sections(report)) is not None:  # the seed report's shape first, then every section
        title, shaped = seed
        out += ["", f"## {title}"]
        for section in shaped:
            out += ["", *markdown.section(section, "### ", limit=None, max_chars=TEXT_CELL)]
        out += ["", "## The full fleet-eval report"]
    for section in sections(report).values():
        out += ["", *markdown.section(section, limit=None, max_chars=TEXT_CELL)]
    return "\n".join(out)
