"""Seed report layouts: for a run whose manifest sets `report: {layout: NAME}` (manifests/reports/),
the sections that seed report has, in its order, under its titles and with its column names,
read from fleet/report/layouts/NAME.yaml and built from the same registry as every other
section (fleet.report.sections, fleet.report.layout_sections).

A layout file is data:

    title: Llama-3.2-3B-Instruct adaptation report
    sections:
      - key: tokens                  # the section's key in this layout (shown as seed-tokens)
        title: "4.4 Token output precision (greedy decoding, temperature 0)"
        section: sequences           # a registered section; omitted: `text` is the content
        columns: {model: model, target: candidate, ref_text: reference output}  # its main table's
        text: ["a paragraph after the section's own blocks"]
        absent: "what to say when the run did not measure it"

A figure the run did not measure (an NPU-only number on a CPU run, a probe that was not asked
for) is a section that says "not measured on this run": never a value copied from the seed.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field

from fleet.contracts.base import Strict
from fleet.contracts.inputs import load_yaml, read_text
from fleet.report import layout_sections, sections  # noqa: F401  (importing them registers their sections)
from fleet.report.blocks import NOT_MEASURED, SECTIONS, Block, Section, Table
from fleet.report.model import RunReport

FOLDER = Path(__file__).with_name("layouts")


class Entry(Strict):
    """One section of a seed report."""

    key: str = Field(description="Unique within the layout; the built section's key is seed-KEY.")
    title: str
    section: str | None = Field(None, description="A registered section (fleet.report.blocks.SECTIONS).")
    columns: dict[str, str] = Field(
        default_factory=dict, description="Column -> header of the section's main (first) table: shown, in this order."
    )
    text: list[str] = Field(default_factory=list, description="Paragraphs after the section's blocks.")
    absent: str | None = Field(None, description="Said when the run did not measure it.")


class Layout(Strict):
    title: str
    sections: list[Entry]


def names() -> list[str]:
    return sorted(p.stem for p in FOLDER.glob("*.yaml"))


@functools.cache
def load(name: str) -> Layout:
    """The layout NAME, checked: every section it places is registered, no key twice."""
    path = FOLDER / f"{name}.yaml"
    layout = Layout.model_validate(load_yaml(read_text(path, what="report layout"), source=str(path)))
    keys = [e.key for e in layout.sections]
    if dup := sorted({k for k in keys if keys.count(k) > 1}):
        raise ValueError(f"{path}: section keys {dup} appear twice")
    if unknown := [e.section for e in layout.sections if e.section is not None and e.section not in SECTIONS]:
        raise ValueError(f"{path}: sections {unknown} are not registered; registered: {sorted(SECTIONS)}")
    return layout


def seed_sections(report: RunReport) -> tuple[str, list[Section]] | None:
    """(the seed report's title, its sections) when the run's manifest names a layout, else None."""
    name = report.info.layout
    if name is None:
        return None
    layout = load(name)
    return f"{layout.title} (seed report {name}, reproduced on this run)", [_build(e, report) for e in layout.sections]


def _build(entry: Entry, report: RunReport) -> Section:
    blocks: list[Block] = list(entry.text)
    absent = entry.absent or NOT_MEASURED
    if entry.section is not None:
        built = SECTIONS[entry.section].section(report)
        blocks = _renamed(built.blocks, entry.columns) + blocks if built.blocks else []
        absent = entry.absent or built.absent
    return Section(f"seed-{entry.key}", entry.title, blocks, absent)


def _renamed(blocks: list[Block], columns: dict[str, str]) -> list[Block]:
    """`blocks` with the section's main table (its first) showing `columns`; other tables, such
    as the matrix's self-consistency pairs, keep their own."""
    first = next((i for i, b in enumerate(blocks) if isinstance(b, Table)), None)
    if first is None or not columns:
        return blocks
    main = blocks[first]
    assert isinstance(main, Table)
    return [*blocks[:first], main.renamed(columns), *blocks[first + 1 :]]
