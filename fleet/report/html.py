"""The run report as one self-contained HTML file that answers first: the verdict banner, the
summary (fleet.report.summary: one row per target, its verdict, parity against the noise model and
speed) and the plots (fleet.report.plots) fill the first screen; every section of
fleet.report.sections follows folded in a <details>, so a reader opens only what they question.

The page has no scripts and loads nothing: CSS is inline, plots are inline SVG, and a
Content-Security-Policy forbids any fetch, so the file opens the same offline, attached to a
ticket or years later.
"""

from __future__ import annotations

from html import escape

import polars as pl

from fleet.analysis import consistency
from fleet.report import drilldown, plots, summary
from fleet.report.blocks import Block, Section, Table
from fleet.report.layouts import seed_sections
from fleet.report.model import RunReport
from fleet.report.sections import sections
from fleet.report.table import cell, worst_first

CSS = """
body{font-family:system-ui,'Segoe UI',Roboto,sans-serif;margin:24px auto;max-width:1380px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
h3{font-size:15px}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f3f5f8}tr:nth-child(even) td{background:#fafbfc}
td.num{text-align:right;font-variant-numeric:tabular-nums}
table td.pass{background:#e3f4e1;color:#1d6b1a;font-weight:600}
table td.fail{background:#fbe3e3;color:#a11;font-weight:600}
code{font-size:11px;word-break:break-all}
.banner{padding:10px 14px;border-radius:6px;font-weight:600;margin:10px 0}.PASS{background:#e3f4e1;color:#1d6b1a}
.FAIL{background:#fbe3e3;color:#a11}.No{background:#f3f5f8}.plots{display:flex;flex-wrap:wrap;gap:12px}
.meta{color:#555;font-size:13px}.absent{color:#666;font-style:italic}
.notices{font-size:13.5px}.notices ul{margin:0;padding-left:18px}
td.text{max-width:400px;white-space:pre-wrap;word-break:break-all}
details.section{border-bottom:1px solid #ddd;overflow-x:auto}details.section>summary{cursor:pointer;padding:4px 0}
details.section>summary h2{display:inline;border:0}details.fold>summary{cursor:pointer;font-size:13px;margin:6px 0}
#summary td{white-space:nowrap}#summary p{color:#555;font-size:12.5px;margin:4px 0;max-width:1100px}
.plots svg{flex:1 1 560px;max-width:660px;height:auto}
"""
HTML_ROWS = 500  # per-prompt rows shown; a 10k-prompt run must still open quickly
TEXT_CELL = 300  # characters of generated text shown per cell
# No script and no fetch: the file must render identically offline (the browser test checks it).
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
NOTICES = 3  # notice lines shown above the summary; the rest are folded in the same banner
OPEN = {"parity"}  # sections open on load, besides gates when one fails: the rest is there when questioned
PLOTTED = [
    "parity",
    "sequences",
    "setting_effects",
    "throughput",
    "scenarios",
    "load_parity",
    "sweeps",
    "layers",
    "drilldown",
]  # sections with plots


def html_table(t: Table, *, limit: int | None = HTML_ROWS) -> str:
    """A blocks.Table as a <table>: its columns and detail columns, the worst rows first when cut;
    folded in a closed <details> under its title when the table says so (Table.fold)."""
    frame, note = t.frame, ""
    if t.worst is not None:
        frame, note = worst_first(frame, by=t.worst[0], descending=t.worst[1], limit=limit)
    columns = {**t.columns, **t.detail}
    keep = [c for c in columns if c in frame.columns]
    frame = frame.select(keep).with_columns(pl.col(c).str.slice(0, TEXT_CELL) for c in t.wrap if c in keep)
    rows = []
    for row in frame.iter_rows(named=True):
        cells = []
        for c, v in row.items():
            cls = (
                v.lower() if c == "verdict" else "num" if isinstance(v, int | float) else "text" if c in t.wrap else ""
            )
            content = f"<code>{escape(v)}</code>" if c in t.code and v else escape(cell(v))
            if isinstance(v, bool):  # ✓/✗ are in every common font; emoji need a colour-emoji font
                cls, content = ("pass", "✓") if v else ("fail", "✗")
            cells.append(f'<td class="{cls}">{content}</td>' if cls else f"<td>{content}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{escape(columns[c])}</th>" for c in keep)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    table += f"<p>{escape(note)}</p>" if note else ""
    if t.fold:
        return f'<details class="fold"><summary>{escape(t.title or "more")}</summary>{table}</details>'
    return (f"<h3>{escape(t.title)}</h3>" if t.title else "") + table


def _block(block: Block) -> str:
    if isinstance(block, str):
        return f"<p>{escape(block)}</p>"
    if isinstance(block, list):
        return "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in block) + "</ul>"
    return html_table(block)


def _section(s: Section, *, opened: bool = False) -> str:
    """A detail section, folded: its title is the <summary> a reader clicks to open it."""
    body = "".join(_block(b) for b in s.blocks) if s.blocks else f'<p class="absent">{escape(s.absent)}</p>'
    head = f'<summary><h2 id="{s.key}">{escape(s.title)}</h2></summary>'
    return f'<details class="section"{" open" if opened else ""}>{head}{body}</details>'


def _notices(notices: list[str]) -> str:
    """One banner, its first NOTICES lines shown and the rest folded: a run with a failed target
    has a notice per failed shard too, which would push the summary off the first screen."""
    if not notices:
        return ""
    items = [f"<li>{escape(notice)}</li>" for notice in notices]
    shown = "<ul>" + "".join(items[:NOTICES]) + "</ul>"
    if len(items) > NOTICES:
        more = f"<summary>{len(items) - NOTICES} more notices</summary><ul>{''.join(items[NOTICES:])}</ul>"
        shown += f'<details class="fold">{more}</details>'
    return f'<div class="banner FAIL notices">{shown}</div>'


def _summary(report: RunReport) -> str:
    """The first screen's table and its notes, unfolded, then every plot."""
    s = summary.section(report)
    charts = [chart for key in PLOTTED for chart in _plots(report, key)]
    body = f'<section id="summary"><h2>{escape(s.title)}</h2>{"".join(_block(b) for b in s.blocks)}</section>'
    return body + ('<h2 id="plots">Plots</h2><div class="plots">' + "".join(charts) + "</div>" if charts else "")


def _plots(report: RunReport, key: str) -> list[str]:
    """The plots of a measured section, coloured per target (RunReport.colors)."""
    t, colors = report.tables, report.colors
    if key == "parity":
        keys = ("model", "target", "prompt_set", "prompt_id", "position")  # the scatter breaks ties by them
        tokens = report.tokens.select(*keys, "logprob", "ref_logprob")
        return [plots.logprob_scatter(tokens, colors), plots.drift_by_position(tokens, colors)]
    if key == "sequences":
        return [plots.divergence_histogram(report.sequences, colors)]
    if key == "setting_effects" and report.consistency is not None and report.consistency.height:
        effects = consistency.effects(report.consistency, report.parity)
        return [plots.setting_effects(effects)] if effects.height else []
    if key == "throughput":
        return [plots.latency_cdf(t["requests"], c, colors, name=n) for c, n in (("ttft_s", "TTFT"), ("e2e_s", "E2E"))]
    if key == "scenarios" and report.scenarios is not None:
        return plots.throughput_vs_concurrency(report.scenarios, colors)
    if key == "load_parity" and report.load_parity is not None:
        return plots.parity_vs_load(report.load_parity, colors)
    if key == "sweeps" and report.sweeps is not None:
        return plots.sweep_curves(report.sweeps, colors)
    if key == "layers" and report.layers is not None:
        return [plots.layer_errors(report.layers, colors, metric=m) for m in ("rel_l2", "cosine")]
    if key == "drilldown":
        curve, _ = drilldown.view(t.get("drilldown"), report.info)
        return plots.drilldown_curves(curve, colors) if curve.height else []
    return []


def render_html(report: RunReport) -> str:
    """The whole report as one HTML document."""
    info = report.info
    title = f"fleet-eval report: {report.run_id}"
    meta = escape(
        f"status {info.status} · started {info.started_at} · finished {info.finished_at} · "
        f"manifest {info.manifest_path} (sha256 {(info.manifest_sha256 or '')[:12]}) · "
        f"reference {report.reference}"
    )
    verdict = report.verdict_line
    body = [f"<h1>{escape(title)}</h1>", f'<p class="meta">{meta}</p>']
    body.append(f'<div class="banner {verdict.split()[0].rstrip(":")}">{escape(verdict)}</div>')
    body.append(_notices(report.notices))
    body.append(_summary(report))
    if (seed := seed_sections(report)) is not None:  # the seed report's own sections, in its order
        seed_title, shaped = seed
        body.append(f'<h2 class="seed">{escape(seed_title)}</h2>')
        body += [_section(s) for s in shaped]
        body.append("<h2>The full fleet-eval report</h2>")
    else:
        body.append("<h2>Details</h2>")
    by_key = sections(report)
    opened = OPEN | ({"gates"} if report.gates_passed is False else set())  # a failure is the next question
    order = ["gates", *(key for key in by_key if key != "gates")]  # the verdicts first, then the text summary's order
    body += [_section(by_key[key], opened=key in opened) for key in order]
    head = f'<meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="{CSP}">'
    head += f"<title>{escape(title)}</title><style>{CSS}</style>"
    return f'<!DOCTYPE html><html lang="en"><head>{head}</head><body>{"".join(body)}</body></html>'
