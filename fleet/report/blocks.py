"""What a report is made of, and the registry of its sections.

A section is registered once (`register`): its key, title, Markdown chapter, columns with their
display names, and a build function over the run's report (fleet.report.model.RunReport: the
run's tables and the figures fleet.analysis computed from them) returning blocks: paragraphs,
lists of lines and tables. The text, Markdown and HTML reports render every standard section
in registration order (fleet.report.sections); a seed layout (fleet.report.layouts) picks
sections by key, retitles them and renames their headers. Adding a section is an analysis
function in fleet.analysis and one `@register` in fleet.report.sections (CONTRIBUTING.md).

A section with no blocks was not measured on this run, and every format says so rather than
leaving the section out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from fleet.report.model import RunReport

NOT_MEASURED = "not measured on this run"


@dataclass(frozen=True)
class Table:
    frame: pl.DataFrame
    columns: Mapping[str, str]  # column -> header: which columns, in which order
    title: str = ""  # a sub-heading, e.g. the model of an architecture table
    worst: tuple[str, bool] | None = None  # (column, descending): the rows kept first when a format cuts
    code: tuple[str, ...] = ()  # columns holding code (the gates' evidence expressions)
    wrap: tuple[str, ...] = ()  # columns of free text, which the HTML wraps
    detail: Mapping[str, str] = field(default_factory=dict)  # more free-text columns, only where there is room
    fold: bool = False  # the HTML folds it (closed <details>): long content few readers need, e.g. code

    def renamed(self, headers: Mapping[str, str]) -> Table:
        """This table showing `headers`' columns (those it has) in their order, under their names:
        a seed layout's shape."""
        return replace(self, columns={c: h for c, h in headers.items() if c in self.frame.columns}, detail={})


Block = str | list[str] | Table  # a paragraph, a list of lines, a table


@dataclass(frozen=True)
class Section:
    """A section as built for one run: what the formats lay out."""

    key: str
    title: str
    blocks: list[Block]  # empty: not measured
    absent: str = NOT_MEASURED  # what the section says when empty


Build = Callable[["RunReport", "SectionSpec"], list[Block]]


@dataclass(frozen=True)
class SectionSpec:
    """One registered section: everything the formats need to know about it."""

    key: str
    title: str
    chapter: str  # the Markdown report's chapter (fleet.report.markdown.CHAPTERS, or a new one)
    build: Build
    columns: Mapping[str, str] = field(default_factory=dict)  # its main table's columns -> headers
    standard: bool = True  # in every report; False: only where a seed layout places it
    absent: str = NOT_MEASURED

    def table(self, frame: pl.DataFrame | None, **kwargs: Any) -> list[Block]:
        """`frame` as this section's main table, or nothing when the run did not measure it."""
        if frame is None or frame.is_empty():
            return []
        return [Table(frame, self.columns or {c: c for c in frame.columns}, **kwargs)]

    def section(self, report: RunReport) -> Section:
        return Section(self.key, self.title, self.build(report, self), self.absent)


# Every registered section by key, in registration order: the order of the text summary.
SECTIONS: dict[str, SectionSpec] = {}


def register(
    key: str,
    title: str,
    *,
    chapter: str,
    columns: Mapping[str, str] | None = None,
    standard: bool = True,
    absent: str = NOT_MEASURED,
) -> Callable[[Build], Build]:
    """Register the decorated build function as section `key`."""

    def add(build: Build) -> Build:
        if key in SECTIONS:
            raise ValueError(f"report section {key!r} is registered twice")
        SECTIONS[key] = SectionSpec(key, title, chapter, build, dict(columns or {}), standard, absent)
        return build

    return add
