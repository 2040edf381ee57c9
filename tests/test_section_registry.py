"""A report section is one registration: a section added in two files (tests/section_example.py,
the analysis; the registration here) appears in the text, Markdown and HTML reports, in its
chapter, with its headers; and a seed layout places, retitles and renames registered sections."""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from section_example import tail_share
from test_compare import DIVERGED, SAME, write_run

from fleet.report import html as html_report
from fleet.report import layouts, markdown, text
from fleet.report.blocks import SECTIONS, Block, SectionSpec, Table, register
from fleet.report.model import RunReport

TITLE = "Tail share (teacher-forced positions beyond 0.1 nats)"


@pytest.fixture
def tail_section() -> Iterator[None]:
    @register("tail_share", TITLE, chapter="Accuracy", columns={"target": "candidate", "tail_share": "share > 0.1"})
    def build(r: RunReport, spec: SectionSpec) -> list[Block]:
        return spec.table(tail_share(r.tokens, r.reference))

    yield
    del SECTIONS["tail_share"]


@pytest.mark.usefixtures("tail_section")
def test_a_section_registered_in_two_files_is_in_every_format(tmp_path: Path) -> None:
    report = RunReport.build(write_run(tmp_path / "r", {"cand": DIVERGED, "good": SAME}))
    shares = dict(tail_share(report.tokens, report.reference).select("target", "tail_share").iter_rows())
    assert shares["cand"] > shares["good"]  # the diverged candidate has the heavier tail: a figure, not a constant
    formats = {"text": text.render(report), "markdown": markdown.render_markdown(report)}
    formats["html"] = html.unescape(html_report.render_html(report))
    for fmt, document in formats.items():
        assert TITLE in document, fmt
        section = document[document.index(TITLE) :]
        assert "share > 0.1" in section and "candidate" in section, fmt
    md = formats["markdown"]  # in its chapter: after the parity section, before Performance
    assert md.index("Parity vs reference") < md.index(TITLE) < md.index("Performance")


def test_a_key_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register("parity", "again", chapter="Accuracy")(lambda r, s: [])


def test_every_layout_loads_and_places_registered_sections() -> None:
    assert layouts.names() == ["001-llama-3.2-3b", "002-qwen2.5-0.5b", "003-qwen-7b", "004-openelm-3b"]
    for name in layouts.names():
        layout = layouts.load(name)
        placed = [e.section for e in layout.sections if e.section is not None]
        assert placed and all(s in SECTIONS for s in placed), name
        for entry in layout.sections:  # renamed headers name columns the section can show
            if entry.columns and entry.section is not None:
                assert entry.columns.keys() >= {"model"}, (name, entry.key)


def test_a_layout_renames_headers_and_keeps_the_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_run(
        tmp_path / "r",
        {"cand": DIVERGED, "good": SAME},
        gate_specs=[{"metric": "pearson_r", "op": ">=", "threshold": 0.5}],
    )
    report = RunReport.build(run)
    info = replace(report.info, manifest_resolved=report.info.manifest_resolved | {"report": {"layout": "x"}})
    layout = layouts.Layout.model_validate(
        {
            "title": "A seed",
            "sections": [
                {"key": "p", "title": "4.2 Precision", "section": "parity"}
                | {"columns": {"model": "m", "target": "cand"}},
                {"key": "mem", "title": "5.2 Memory", "absent": "no memory figures"},
                {"key": "v", "title": "8 Verdict", "section": "gates", "columns": {"gate": "check", "verdict": "ok"}},
            ],
        }
    )
    monkeypatch.setattr(layouts, "load", lambda name: layout)
    shaped = layouts.seed_sections(replace(report, info=info))
    assert shaped is not None
    title, [precision, memory, verdict] = shaped
    assert title.startswith("A seed") and precision.key == "seed-p" and precision.title == "4.2 Precision"
    table = precision.blocks[0]
    assert isinstance(table, Table) and dict(table.columns) == {"model": "m", "target": "cand"}
    assert table.frame.equals(report.parity)  # renamed, not recomputed
    assert not memory.blocks and memory.absent == "no memory figures"
    # Only the main table takes the layout's names: the gates' evidence table keeps its own.
    verdicts, evidence = [b for b in verdict.blocks if isinstance(b, Table)]
    assert dict(verdicts.columns) == {"gate": "check", "verdict": "ok"} and "evidence" in evidence.columns
