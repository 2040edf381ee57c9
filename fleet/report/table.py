"""Cells and tables as text: the one table writer of the text summary, the Markdown report and
`fleet compare`, and the one cell format every report uses (HTML included).

Tables are GitHub-flavoured Markdown pipe tables laid out by Polars (tbl_formatting="MARKDOWN"),
so a summary pastes straight into an adaptation report and renders there as a table: every cell
and header is text already, with `|` escaped as `\\|` and line breaks shown as ⏎, so that no
cell can add or split a column.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

import polars as pl


def cell(value: Any) -> str:
    """One value for reading: 4 significant digits (a float32 port's 3e-6 must not print as 0.0000),
    ✅/❌ for booleans, — for a value that is not there (null, NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "✅" if value else "❌"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# Every character str.splitlines() breaks a line at (a model can generate \x0b or U+2028): any of
# them left in a cell would end the table row there.
_BREAKS = str.maketrans({"\r": ""} | dict.fromkeys("\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029", "⏎"))


def escape(text: str) -> str:
    """`text` as the content of one pipe-table cell."""
    return text.replace("|", "\\|").translate(_BREAKS)


def markdown(
    frame: pl.DataFrame,
    columns: Mapping[str, str] | None = None,
    *,
    code: Collection[str] = (),
    max_chars: int | None = None,
) -> str:
    """`frame` as a pipe table. `columns` selects and renames (column -> header; default: all, as
    named); `code` columns are set as `code`; `max_chars` cuts longer cells other than code, ending
    them with …."""
    columns = columns or {c: c for c in frame.columns}
    keep = [c for c in columns if c in frame.columns]
    if not keep:
        return ""
    rows = [
        [f"`{cell(v)}`" if c in code and v is not None else cell(v) for c, v in zip(keep, row, strict=True)]
        for row in frame.select(keep).iter_rows()
    ]
    if max_chars is not None:  # code is cut nowhere: it is there to be copied
        rows = [
            [
                v if len(v) <= max_chars or c in code else v[: max_chars - 1] + "…"
                for c, v in zip(keep, row, strict=True)
            ]
            for row in rows
        ]
    headers = _unique([escape(columns[c]) for c in keep])
    text = pl.DataFrame([[escape(v) for v in row] for row in rows], schema=headers, orient="row")
    with pl.Config(
        tbl_formatting="MARKDOWN",
        tbl_hide_column_data_types=True,
        tbl_hide_dataframe_shape=True,
        tbl_rows=-1,
        tbl_cols=-1,
        tbl_width_chars=-1,  # never wrap a row onto a second line: that would be another row
        fmt_str_lengths=1_000_000,  # cut above, where the cut cannot split an escape
        fmt_table_cell_list_len=-1,
    ):
        return str(text)


def _unique(headers: list[str]) -> list[str]:
    """Polars needs distinct column names; two columns may share a display name."""
    seen: dict[str, int] = {}
    out = []
    for h in headers:
        seen[h] = seen.get(h, 0) + 1
        out.append(h if seen[h] == 1 else f"{h} ({seen[h]})")
    return out


def worst_first(frame: pl.DataFrame, *, by: str, descending: bool, limit: int | None) -> tuple[pl.DataFrame, str]:
    """At most `limit` rows (None: all), the worst by `by` when some must go, and a note saying so."""
    if limit is None or frame.height <= limit:
        return frame, ""
    kept = frame.sort(by, descending=descending, nulls_last=True).head(limit)
    return kept, f"Showing the {limit} worst of {frame.height} rows by {by}; `fleet query` has them all."
