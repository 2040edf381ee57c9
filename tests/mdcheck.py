"""Markdown checks for the reports' outputs, with markdown-it-py's GFM table rule.

`tables` asserts that every pipe table in a text parses as a table, that the table spans exactly
its own lines (a line of prose right after a table would otherwise become a row), and that every
row has the header's number of cells, counted on the source, where an unescaped `|` in a cell
would add one (the parser itself pads or cuts rows to the header's width, so its tokens alone
cannot tell).
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt

_PIPE = re.compile(r"(?<!\\)\|")


def cells(line: str) -> list[str]:
    """The cells of one table line, unescaped `|` being the separators, stripped."""
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [c.strip() for c in _PIPE.split(inner)]


def _blocks(lines: list[str]) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive lines starting with `|`."""
    out, start = [], None
    for i, line in enumerate([*lines, ""]):
        if line.lstrip().startswith("|"):
            start = i if start is None else start
        elif start is not None:
            out.append((start, i))
            start = None
    return out


def tables(text: str) -> list[list[list[str]]]:
    """Every table of `text` as rows of cells, unescaped (header first, delimiter row left out), checked as above."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    lines = text.splitlines()
    opened = [i for i, t in enumerate(tokens) if t.type == "table_open"]
    spans = [tuple(tokens[i].map or ()) for i in opened]
    assert spans == _blocks(lines), f"pipe blocks that are not tables, or tables that swallowed a line: {spans}"
    out = []
    for i, (start, end) in zip(opened, spans, strict=True):
        header = cells(lines[start])
        close = next(j for j in range(i, len(tokens)) if tokens[j].type == "table_close")
        parsed_rows = [t for t in tokens[i:close] if t.type == "tr_open"]
        assert len(parsed_rows) == end - start - 1, lines[start:end]  # every line but the delimiter is a row
        assert sum(t.type == "th_open" for t in tokens[i:close]) == len(header)
        for line in lines[start:end]:
            assert len(cells(line)) == len(header), f"{len(cells(line))} cells, header has {len(header)}: {line}"
        rows = [header] + [cells(line) for line in lines[start + 2 : end]]
        rows = [[c.replace("\\|", "|") for c in row] for row in rows]
        out.append(rows)
    return out


def rows(text: str) -> list[list[str]]:
    """Every row (header rows too) of every table of `text`, as cells, after checking them."""
    return [row for table in tables(text) for row in table]
