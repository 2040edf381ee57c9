"""The records of one JSONL or CSV slice of a prompt file, read strictly.

A malformed record is a ValueError naming the file, the row (1-based, blank lines not counted, as
everywhere in prompt_source) and what was expected: the driver's `check` reads every slice before
any shard runs, so a bad row stops the run before anything is half-read. CSV goes through Python's
csv module in strict mode, one line at a time, because pyarrow's reader is lenient where it matters
here: it reads an unterminated quote on the last line as a field running to the end of the file,
and a stray quote after a quoted field as text.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

_ONE_LINE = "a CSV record must not span lines: convert such a file to Parquet or JSONL"


def lines(data: bytes) -> list[bytes]:
    """The non-blank lines of a slice, split as `chunks` counts them (on newlines only)."""
    return [line for line in data.split(b"\n") if line.strip()]


def json_rows(file: Path, data: bytes, start: int) -> list[dict[str, Any]]:
    return [_json_row(file, line, start + i) for i, line in enumerate(lines(data))]


def _json_row(file: Path, line: bytes, row: int) -> dict[str, Any]:
    where = f"{file}: row {row + 1}"
    try:
        value = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        msg = f"{where}: not UTF-8 text (byte {e.start})"
        raise ValueError(msg) from None
    except json.JSONDecodeError as e:
        msg = f"{where}: not JSON ({e.msg} at column {e.colno}); expected one JSON object per line"
        raise ValueError(msg) from None
    if not isinstance(value, dict):
        msg = f"{where}: expected a JSON object, got {type(value).__name__}"
        raise ValueError(msg)
    return value


def csv_header(file: Path, header: bytes) -> list[str]:
    """The column names; a header that is empty, malformed or names a column twice is refused."""
    if not header.strip():
        msg = f"{file}: expected a header line naming the columns (id, prompt, ...)"
        raise ValueError(msg)
    names = _record(file, header.removeprefix(b"\xef\xbb\xbf"), None)  # a UTF-8 BOM is not part of a name
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        msg = f"{file}: header: column {', '.join(map(repr, twice))} named twice"
        raise ValueError(msg)
    return names


def csv_rows(file: Path, header: bytes, data: bytes, start: int, wanted: list[str]) -> list[dict[str, Any]]:
    """The `wanted` columns of each record (as text); every record has the header's field count."""
    names = csv_header(file, header)
    keep = [(i, n) for i, n in enumerate(names) if n in wanted]
    rows = []
    for i, line in enumerate(lines(data)):
        fields = _record(file, line, start + i)
        if len(fields) != len(names):
            msg = f"{file}: row {start + i + 1}: {len(fields)} fields, expected {len(names)} as in the header "
            msg += "(quote a field that holds a comma)"
            raise ValueError(msg)
        rows.append({n: fields[j] for j, n in keep})
    return rows


def _record(file: Path, line: bytes, row: int | None) -> list[str]:
    where = f"{file}: {'header' if row is None else f'row {row + 1}'}"
    try:
        text = line.decode("utf-8").removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError as e:
        msg = f"{where}: not UTF-8 text (byte {e.start})"
        raise ValueError(msg) from None
    try:
        [fields] = list(csv.reader([text], strict=True))
    except csv.Error as e:
        if "end of data" in str(e):
            msg = f"{where}: a quote is opened and not closed on the line ({_ONE_LINE})"
        else:
            msg = f"{where}: not a CSV record ({e}); expected a quoted field to end at a comma, quotes inside doubled"
        raise ValueError(msg) from None
    return fields
