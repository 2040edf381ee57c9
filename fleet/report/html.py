"""The run report as one self-contained HTML file: every section of fleet.report.sections, the
gate verdicts first, with inline SVG plots (fleet.report.plots) beside the tables they illustrate.

The page has no scripts and loads nothing: CSS is inline, plots are inline SVG, and a
Content-Security-Policy forbids any fetch, so the file opens the same offline, attached to a
ticket or years later.
"""

from __future__ import annotations

from html import escape

import polars as pl

from fleet.report import plots
from fleet.report.model import RunReport
from fleet.report.sections import TITLES, Block, Section, Table, sections
from fleet.report.seeds import seed_sections
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
td.text{max-width:400px;white-space:pre-wrap;word-break:break-all}
"""
HTML_ROWS = 500  # per-prompt rows shown; a 10k-prompt run must still open quickly
TEXT_CELL = 300  # characters of generated text shown per cell
# No script and no fetch: the file must render identically offline (the browser test checks it).
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
ORDER = ["gates", *(key for key in TITLES if key != "gates")]  # the verdicts first, then the text summary's order


def html_table(t: Table, *, limit: int | None = HTML_ROWS) -> str:
    """A sections.Table as a <table>: its columns and detail columns, the worst rows first when cut."""
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
    title = f"<h3>{escape(t.title)}</h3>" if t.title else ""
    table = f"{title}<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    return table + (f"<p>{escape(note)}</p>" if note else "")


def _block(block: Block) -> str:
    if isinstance(block, str):
        return f"<p>{escape(block)}</p>"
    if isinstance(block, list):
        return "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in block) + "</ul>"
    return html_table(block)


def _section(report: RunReport, s: Section) -> list[str]:
    out = [f'<h2 id="{s.key}">{escape(s.title)}</h2>']
    if not s.blocks:
        return [*out, f'<p class="absent">{escape(s.absent)}</p>']
    out += [_block(b) for b in s.blocks]
    charts = _plots(report, s.key)
    return out + (['<div class="plots">', *charts, "</div>"] if charts else [])


def _plots(report: RunReport, key: str) -> list[str]:
    """The plots of a measured section, coloured per target (RunReport.colors)."""
    t, colors = report.tables, report.colors
    if key == "parity":
        tokens = report.tokens.select("model", "target", "position", "logprob", "ref_logprob")
        return [plots.logprob_scatter(tokens, colors), plots.drift_by_position(tokens, colors)]
    if key == "sequences":
        return [plots.divergence_histogram(report.sequences, colors)]
    if key == "throughput":
        return [plots.latency_cdf(t["requests"], c, colors, name=n) for c, n in (("ttft_s", "TTFT"), ("e2e_s", "E2E"))]
    if key == "scenarios" and report.scenarios is not None:
        return plots.throughput_vs_concurrency(report.scenarios, colors)
    if key == "layers" and report.layers is not None:
        return [plots.layer_errors(report.layers, colors, metric=m) for m in ("rel_l2", "cosine")]
    return []


def render_html(report: RunReport) -> str:
    """The whole report as one HTML document."""
    info = report.info
    title = f"fleet-eval report: {report.run_id}"
    meta = escape(
        f"status {info.get('status')} · started {info.get('started_at')} · finished {info.get('finished_at')} · "
        f"manifest {info.get('manifest_path')} (sha256 {str(info.get('manifest_sha256', ''))[:12]}) · "
        f"reference {report.reference}"
    )
    verdict = report.verdict_line
    body = [f"<h1>{escape(title)}</h1>", f'<p class="meta">{meta}</p>']
    body.append(f'<div class="banner {verdict.split()[0].rstrip(":")}">{escape(verdict)}</div>')
    body += [f'<div class="banner FAIL">{escape(notice)}</div>' for notice in report.notices]
    if (seed := seed_sections(report)) is not None:  # the seed report's own sections, in its order
        title, shaped = seed
        body.append(f'<h2 class="seed">{escape(title)}</h2>')
        for s in shaped:
            body += _section(report, s)
        body.append("<h2>The full fleet-eval report</h2>")
    by_key = sections(report)
    for key in ORDER:
        body += _section(report, by_key[key])
    head = f'<meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="{CSP}">'
    head += f"<title>{escape(title)}</title><style>{CSS}</style>"
    return f'<!DOCTYPE html><html lang="en"><head>{head}</head><body>{"".join(body)}</body></html>'
