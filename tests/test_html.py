"""fleet.report.html, .markdown and fleet.report.plots: content checks, then the page in a real
headless Chromium.

The browser tests skip when Debian's chromium is not installed (`apt-get install -y chromium`).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import struct
import subprocess
from pathlib import Path

import mdcheck
import polars as pl
import pytest
from test_compare import DIVERGED, SAME, write_model_dir, write_run
from test_report import write_full_run

from fleet.analysis import gates
from fleet.report import html as html_report
from fleet.report import markdown, plots, svg
from fleet.report.model import RunReport
from fleet.report.sections import sections

# scatter, drift by position, divergence, setting effects, TTFT CDF, E2E CDF, 2 concurrency sweeps
# (decode, capacity's closed loop), the rate sweep, parity vs load (TF p99 and real divergences),
# layer rel_l2 and cosine, the drill-down's curve
N_PLOTS = 14
GATES = gates.parse(
    [
        {"metric": "first_top1_agreement", "op": ">=", "threshold": 1.0},
        {"metric": "seq_match_rate", "op": ">=", "threshold": 1.0},  # cand diverges on p2: FAIL
    ]
)
LAYERS = pl.DataFrame(
    {"model": ["m"] * 6, "target": ["cand"] * 3 + ["cand2"] * 3, "layer": [0, 1, 2] * 2,
     "rel_l2": [0.0, 0.004, 0.009, 0.0, 0.001, 0.002], "cosine": [1.0, 0.9999, 0.9995, 1.0, 1.0, 0.9999]}
)  # fmt: skip
SWEEP = pl.DataFrame(
    {"model": ["m"] * 3, "target": ["cand"] * 3, "scenario": ["decode"] * 3, "level": [1, 4, 16],
     "output_tok_s": [50.0, 180.0, 400.0]}
)  # fmt: skip
COLORS = {"cand": "#000001", "cand2": "#000002"}


@pytest.fixture
def run(tmp_path: Path) -> Path:
    model_dir = write_model_dir(tmp_path / "model")
    return write_run(tmp_path / "run", {"cand": DIVERGED, "cand2": SAME}, model_dir=model_dir,
                     gate_specs=[g.model_dump(exclude_none=True) for g in GATES])  # fmt: skip


@pytest.fixture
def full(tmp_path: Path) -> RunReport:
    """Every table a report reads: probes, perf scenarios, smoke checks, a matrix (test_report)."""
    return RunReport.build(write_full_run(tmp_path / "full", model_dir=write_model_dir(tmp_path / "model")))


def test_html_is_self_contained(full: RunReport) -> None:
    page = html_report.render_html(full)
    assert page.count("<svg") == N_PLOTS and "not measured" not in page
    # Nothing to fetch and nothing to run: no scripts, links, sources or URLs.
    assert not re.search(r"<script|<link|<img|<iframe|src=|href=|https?:|url\(", page, flags=re.IGNORECASE)
    assert "Content-Security-Policy" in page


def test_html_content(run: Path) -> None:
    page = html_report.render_html(RunReport.build(run))  # gates from run.json, no probe tables
    assert "FAIL: 1 of 4 gate checks fail." in page
    checks = page[page.index('<h2 id="gates">') :]
    assert '<td class="fail">FAIL</td>' in checks and checks.count('<td class="pass">PASS</td>') == 3
    # The evidence is folded in the gates section, the verdict table holds no code.
    verdict_table, evidence = checks.split('<details class="fold"><summary>Evidence')
    assert "<code>" not in verdict_table and evidence.count("<code>") == 4
    assert '<h2 id="layers">Layer-wise probe' in page and "not measured on this run" in page
    assert "LlamaForCausalLM" in page and "<td>parameters</td><td>40</td>" in page and "10000.0" in page
    assert "Test CPU" in page and "0123456789abcdef" in page
    assert html_report.render_html(RunReport.build(run, gates=[])).count("No gates configured") == 2  # banner, section
    failed = RunReport.build(
        write_run(run.parent / "failed", {"cand": SAME}, failures={"m/npu": "RuntimeError: no NPU"})
    )
    assert '<div class="banner FAIL notices"><ul><li>FAILED m/npu: RuntimeError: no NPU</li></ul>' in (
        html_report.render_html(failed)
    )
    many = dataclasses.replace(failed, notices=[f"FAILED shard m/npu/s/{i:05d}" for i in range(5)])
    shown, folded = html_report.render_html(many).split("<summary>2 more notices</summary>")
    assert shown.count("<li>FAILED shard") == 3 and folded.count("<li>FAILED shard") == 2
    text = markdown.render_markdown(failed)
    assert "- FAILED m/npu: RuntimeError: no NPU" in text and mdcheck.tables(text)


def test_summary_and_plots_first_then_folded_sections(run: Path) -> None:
    """Summary, then plots, then every section in a <details>: parity open, gates open as one fails."""
    page = html_report.render_html(RunReport.build(run))
    assert page.index('<section id="summary">') < page.index('<h2 id="plots">') < page.index("<svg")
    assert page.index("<h2>Details</h2>") > page.rindex("<svg")  # every plot before the details
    opened = re.findall(r'<details class="section" open><summary><h2 id="(\w+)">', page)
    assert opened == ["gates", "parity"]
    assert page.count('<details class="section"') == len(sections(RunReport.build(run)))
    passing = html_report.render_html(RunReport.build(run, gates=GATES[:1]))
    assert re.findall(r'<details class="section" open><summary><h2 id="(\w+)">', passing) == ["parity"]


def test_markdown_follows_the_seed_reports(run: Path) -> None:
    text = markdown.render_markdown(RunReport.build(run))
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## 1. Summary", "## 2. Environment and provenance", "## 3. Model architecture",
                        "## 4. Accuracy", "## 5. Performance", "## 6. Conclusion"]  # fmt: skip
    assert "### 4.1 Method" in text and "### 4.3 First step per prompt" in text and "### 6.1 Gates: FAIL" in text
    rows = mdcheck.rows(text)
    # First step of cand: p1 0.75 - 0.5 = 0.25 |diff|; p2 identical. P rel err p1 = |e^-0.75 - e^-0.5| / e^-0.5.
    assert ["m", "cand", "s", "p1", "-0.5", "-0.75", "0.25", "0.6065", "0.4724", "0.2212", "✅"] in rows
    assert "- m / cand: mean |diff| 0.125, mean rel err 11.06%, top-1 agreement 2/2" in text
    # The divergence kind, margin and noise sit between the divergence and correctness columns.
    head, tail = ["m", "cand", "s", "p2", "t5 t8 t9", "t5 t3 t9", "❌", "1", "divergence"], ["—", "—"]
    assert any(row[:9] == head and row[-2:] == tail for row in rows)
    assert "- m / cand: sequence match 1/2 (50.0%), token match 5/6 (83.3%)" in text
    assert text.count("**FAIL: 1 of 4 gate checks fail.**") == 2  # summary and conclusion


def test_long_tables_show_the_worst_rows(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(markdown, "MD_ROWS", 1)
    text = markdown.render_markdown(RunReport.build(run))
    rows = mdcheck.rows(text)
    # Of 4 candidate prompts, cand's diverged p2 is kept; the totals still cover every prompt.
    # The divergence kind, margin and noise sit between the divergence and correctness columns.
    head, tail = ["m", "cand", "s", "p2", "t5 t8 t9", "t5 t3 t9", "❌", "1", "divergence"], ["—", "—"]
    assert any(row[:9] == head and row[-2:] == tail for row in rows)
    assert not [r for r in rows if r[:4] == ["m", "cand2", "s", "p1"] and len(r) == 10]
    assert "Showing the 1 worst of 4 rows by first_divergence" in text
    assert [
        "m",
        "cand",
        "s",
        "p1",
        "-0.5",
        "-0.75",
        "0.25",
        "0.6065",
        "0.4724",
        "0.2212",
        "✅",
    ] in rows  # worst rel err
    assert "- m / cand2: mean |diff| 0.125, mean rel err 11.06%, top-1 agreement 2/2" in text


def test_plots_from_hand_made_frames() -> None:
    assert svg.nice_ticks(0.0, 0.97) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svg.nice_ticks(3.0, 3.0) == [2.4, 2.6, 2.8, 3.0, 3.2, 3.4, 3.6]
    noise = svg.nice_ticks(1.0, 1.0 + 1e-15)  # float noise is one value, not ticks that round to one
    assert noise[0] < 1.0 < noise[-1] and len(set(noise)) == len(noise)
    chart = plots.layer_errors(LAYERS, COLORS)
    assert chart.count("<polyline") == 2 and "<title>cand2</title>" in chart
    assert 'stroke="#000002" fill="#000002"><title>cand2</title>' in chart  # the target's own colour
    assert "rel_l2" in chart and "placeholder" not in chart
    [sweep] = plots.throughput_vs_concurrency(SWEEP, COLORS)
    assert sweep.count("<circle") == 3 and "decode" in sweep
    assert ">0.9995<" in plots.layer_errors(LAYERS, COLORS, metric="cosine")  # y axis zoomed onto the data
    seqs = pl.DataFrame(
        {"model": ["m"] * 3, "target": ["c"] * 3, "tokens_total": [3, 3, 3], "first_divergence": [1, None, 1]}
    )
    bars = plots.divergence_histogram(seqs, {})
    # positions 0, 1, 2 and "none": 0, 2, 0, 1 prompts
    assert [float(x) for x in re.findall(r"<title>c [^:]+: ([\d.]+)</title>", bars)] == [0, 2, 0, 1]
    assert "no data" in svg.scatter({"a": ([float("nan")], [1.0])}, title="t", x_label="x", y_label="y")


def test_the_logprob_scatter_is_the_same_whatever_the_row_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # Equal |dlogp| everywhere past the cap: which points are kept and their order follow the keys,
    # not the order the rows were read in (a page rendered twice is the same page).
    monkeypatch.setattr(plots, "_SCATTER_CAP", 5)
    n = 40
    tokens = pl.DataFrame(
        {
            "model": ["m"] * n,
            "target": ["c"] * n,
            "prompt_set": ["s"] * n,
            "prompt_id": [f"p{i % 7}" for i in range(n)],
            "position": list(range(n)),
            "logprob": [-1.0 - (i % 3 == 0) for i in range(n)],
            "ref_logprob": [-1.5] * n,
        }
    )
    pages = {plots.logprob_scatter(tokens.sample(fraction=1.0, shuffle=True, seed=seed), {}) for seed in range(6)}
    assert len(pages) == 1 and "5 of 40 positions" in pages.pop()


# --- in a real browser ---------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars"]  # fmt: skip


def _chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *extra]
    return subprocess.run([*args, page.as_uri()], capture_output=True, text=True, timeout=120, check=True)


def _console(stderr: str) -> list[str]:
    """Console messages (errors, CSP violations, uncaught exceptions) from Chromium's log."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@needs_chromium
def test_page_renders_in_chromium(full: RunReport, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(html_report.render_html(full), encoding="utf-8")
    dom = _chromium(page, tmp_path / "profile", "--dump-dom")
    assert dom.stdout.count("<svg") == N_PLOTS and dom.stdout.count("<polyline") >= 5
    assert _console(dom.stderr) == []
    shot = tmp_path / "report.png"
    result = _chromium(page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,3000")
    assert _console(result.stderr) == []
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1400, 3000)
    assert shot.stat().st_size > 50_000  # a blank page compresses to a few KB


# Appended to a copy of the page (its CSP allows this one inline script): the summary table's box
# and the viewport, written into the DOM that --dump-dom prints.
PROBE = (
    "<script>const box = document.querySelector('#summary table').getBoundingClientRect();"
    "document.body.dataset.fold = [box.top, box.bottom, box.right, innerWidth, innerHeight].join(' ');</script>"
)


@needs_chromium
def test_summary_is_above_the_fold(full: RunReport, tmp_path: Path) -> None:
    """At 1280x800 the whole summary table is on the first screen, without scrolling either way."""
    report = RunReport.build(full.run_dir, gates=GATES)  # five targets, a verdict on each candidate
    page = tmp_path / "probe.html"
    csp = html_report.CSP
    page.write_text(html_report.render_html(report).replace(csp, f"{csp}; script-src 'unsafe-inline'").replace(
        "</body>", f"{PROBE}</body>"), encoding="utf-8")  # fmt: skip
    dom = _chromium(page, tmp_path / "profile", "--window-size=1280,800", "--dump-dom")
    assert _console(dom.stderr) == []
    probe = re.search(r'data-fold="([^"]+)"', dom.stdout)
    assert probe, "the probe script did not run"
    top, bottom, right, width, height = map(float, probe[1].split())
    # The viewport is the window less what headless Chromium reserves for its frame (657 px high here).
    assert width == 1280 and 0 < height <= 800
    assert 0 < top < bottom <= height and right <= width, (top, bottom, right, width, height)


@needs_chromium
def test_console_check_catches_errors(tmp_path: Path) -> None:
    """The check above is not vacuous: a script error and a blocked fetch both show up."""
    page = tmp_path / "bad.html"
    csp = f'<meta http-equiv="Content-Security-Policy" content="{html_report.CSP}">'
    page.write_text(f'<html><head>{csp}</head><body><img src="http://192.0.2.1/x.png"></body></html>')
    assert any(
        "Content Security Policy" in line for line in _console(_chromium(page, tmp_path / "p", "--dump-dom").stderr)
    )
    page.write_text("<html><body><script>throw new Error('boom')</script></body></html>")
    assert any(
        "Uncaught Error: boom" in line for line in _console(_chromium(page, tmp_path / "p", "--dump-dom").stderr)
    )
