"""Prompt files at dataset scale (JSONL, Parquet, CSV): a file plus its column mapping, read one
row range at a time, so that neither the driver nor an actor ever holds a whole prompt set.

The driver checks a file once, chunk by chunk (`check`), and cuts it into row ranges (`chunks`);
a shard carries its `FileSlice` and the actor that runs it reads just those rows (`read_slice`).
Both sides use this module, so it lives in fleet.contracts (pyarrow is on both sides).

JSONL and CSV slices are byte ranges found by one pass over the lines: a CSV record must not
span lines (a quoted line break is refused with a message; convert such a file to Parquet). Every
reader is strict (fleet/contracts/prompt_rows.py): a malformed row is an error naming the file and
the row, found by `check` before any shard runs.
Parquet slices are row ranges inside row groups; an actor keeps the last row group it decoded,
because consecutive shards mostly fall in the same one.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from fleet.contracts.base import Strict
from fleet.contracts.inputs import clip
from fleet.contracts.messages import error_line, relevant
from fleet.contracts.prompt_rows import csv_rows, json_rows
from fleet.contracts.prompts import NUMBER, Expected, Prompt

Format = Literal["jsonl", "parquet", "csv"]
Rule = Literal["contains", "exact", "regex", "number"]
_SUFFIXES: dict[str, Format] = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".csv": "csv"}
CHECK_ROWS = 20_000  # rows per chunk when the driver checks a file: bounds its memory


class PromptFile(Strict):
    """`{file: gsm8k.parquet, id: idx, prompt: question, expected: {number: answer}}`: which
    columns hold the id, the text (or chat messages) and the expected answer."""

    file: Path = Field(description="JSONL, Parquet or CSV file; relative to the manifest.")
    format: Format | None = Field(None, description="jsonl | parquet | csv; default: from the file's suffix.")
    id: str = Field("id", description="Column holding each prompt's id (unique within the file).")
    prompt: str | None = Field(None, description="Column holding the text prompt (default: 'prompt').")
    messages: str | None = Field(
        None, description="Column holding chat messages: a list of {role, content}, or that list as JSON text."
    )
    expected: dict[Rule, str] | str | None = Field(
        None,
        description="{rule: column}, e.g. {number: answer} (number: the last number in the column's text); or "
        "a column holding inline-form rule objects such as {number: 4}; default: an 'expected' column if any.",
    )
    rows: int | None = Field(None, ge=1, description="Filled when checked: how many prompts the file holds.")
    sha256: str | None = Field(None, description="Filled when checked: the file's digest (resume checks it).")

    @model_validator(mode="after")
    def _text_or_chat(self) -> PromptFile:
        if self.prompt is not None and self.messages is not None:
            msg = "give at most one of 'prompt' or 'messages' (the column holding each prompt)"
            raise ValueError(msg)
        if isinstance(self.expected, dict) and len(self.expected) != 1:
            msg = f"expected maps exactly one rule to a column (got {sorted(self.expected) or 'none'})"
            raise ValueError(msg)
        return self

    @property
    def kind(self) -> Format:
        if self.format is not None:
            return self.format
        kind = _SUFFIXES.get(self.file.suffix.lower())
        if kind is None:
            msg = f"{self.file}: cannot tell the format from the suffix; set format: jsonl | parquet | csv"
            raise ValueError(msg)
        return kind


@dataclass(frozen=True)
class FileSlice:
    """Rows [start, stop) of a prompt file; for JSONL and CSV also their bytes [offset, end)."""

    source: PromptFile
    start: int
    stop: int
    offset: int = 0
    end: int = 0


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def chunks(source: PromptFile, size: int) -> Iterator[FileSlice]:
    """The file cut into slices of `size` rows, in order; one streaming pass, nothing kept."""
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        n = pq.ParquetFile(source.file).metadata.num_rows
        yield from (FileSlice(source, i, min(i + size, n)) for i in range(0, n, size))
        return
    with source.file.open("rb") as f:
        offset = len(f.readline()) if source.kind == "csv" else 0  # the header
        row, start_row, start = 0, 0, offset
        for line in f:
            if line.strip():
                if row - start_row == size:
                    yield FileSlice(source, start_row, row, start, offset)
                    start_row, start = row, offset
                row += 1
            offset += len(line)
        if row > start_row:
            yield FileSlice(source, start_row, row, start, offset)


def check(source: PromptFile) -> PromptFile:
    """Read the whole file once, a chunk at a time: every row must make a prompt, ids unique.
    Returns it with `rows` and `sha256` filled; errors name the file and the row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not source.file.is_file():
        msg = f"prompts file not found: {source.file}"
        raise ValueError(msg)
    ids: list[pa.Array] = []
    rows = 0
    with _no_cycle_collection():
        for piece in chunks(source, CHECK_ROWS):
            prompts = read_slice(piece)
            ids.append(pa.array([p.id for p in prompts], pa.string()))
            rows = piece.stop
    if not rows:
        msg = f"{source.file}: no prompts in the file"
        raise ValueError(msg)
    all_ids = pa.chunked_array(ids, pa.string())
    if len(pc.unique(all_ids)) != rows:
        counts = pc.value_counts(all_ids)
        dupes = [str(v["values"]) for v in counts.to_pylist() if v["counts"] > 1][:5]
        msg = f"{source.file}: duplicate ids: {', '.join(dupes)}"
        raise ValueError(msg)
    return source.model_copy(update={"rows": rows, "sha256": digest(source.file)})


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector off while a file is checked: each chunk's 20,000 prompts live long
    enough to count as old objects, so every few chunks triggered a full collection of the whole heap
    (17 of them for 200,000 prompts, ~70 ms each: a third of the check; docs/measurements.md). A
    chunk's objects hold no cycles and go by reference counting as the next chunk replaces them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_slice(piece: FileSlice) -> list[Prompt]:
    """The prompts of one slice, validated; an error names the file and the row."""
    source = piece.source
    return [_prompt(source, row, piece.start + i) for i, row in enumerate(_rows(piece))]


def _rows(piece: FileSlice) -> list[dict[str, Any]]:
    source = piece.source
    if source.kind == "parquet":
        return _parquet_rows(piece)
    with source.file.open("rb") as f:
        header = f.readline() if source.kind == "csv" else b""
        f.seek(piece.offset)
        data = f.read(piece.end - piece.offset)
    if source.kind == "jsonl":
        return json_rows(source.file, data, piece.start)
    wanted = [*_columns(source), "prompt", "messages", "expected"]
    return csv_rows(source.file, header, data, piece.start, wanted)


def _columns(source: PromptFile) -> list[str]:
    expected = source.expected if isinstance(source.expected, str) else None
    mapped = [*(source.expected or {}).values()] if isinstance(source.expected, dict) else [expected]
    return [c for c in [source.id, source.prompt, source.messages, *mapped] if c]


def _parquet_rows(piece: FileSlice) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = piece.source
    meta = pq.ParquetFile(source.file).metadata
    names = set(meta.schema.names)
    wanted = tuple(c for c in [*_columns(source), "prompt", "messages", "expected"] if c in names)
    parts, first = [], 0
    for group in range(meta.num_row_groups):
        n = meta.row_group(group).num_rows
        lo, hi = max(piece.start, first), min(piece.stop, first + n)
        if lo < hi:
            parts.append(_row_group(str(source.file), source.sha256, group, wanted).slice(lo - first, hi - lo))
        first += n
    return pa.concat_tables(parts).to_pylist() if parts else []


@functools.lru_cache(maxsize=1)
def _row_group(path: str, sha256: str | None, group: int, columns: tuple[str, ...]) -> Any:
    """One decoded row group (the projected columns); `sha256` keys the cache to the file's bytes."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).read_row_group(group, columns=list(columns))


def _prompt(source: PromptFile, row: dict[str, Any], index: int) -> Prompt:
    where = f"{source.file}: row {index + 1}"
    text_col = source.prompt or ("prompt" if source.messages is None and "prompt" in row else None)
    chat_col = source.messages or ("messages" if text_col is None else None)
    if source.prompt is None and source.messages is None and not {"prompt", "messages"} & set(row):
        msg = f"{where}: expected a 'prompt' or 'messages' column (columns: {', '.join(row)}); or map one"
        raise ValueError(msg)
    for col in [source.id, text_col or chat_col]:
        if col not in row:
            msg = f"{where}: no column {col!r} (columns: {', '.join(row)})"
            raise ValueError(msg)
        if row[col] is None:
            msg = f"{where}: column {col!r} is empty"
            raise ValueError(msg)
    # Strict types: a number or a list where text belongs is a wrong column, not a prompt to str().
    _expect(where, source.id, row[source.id], (str, int), "text or an integer")
    fields: dict[str, Any] = {"id": str(row[source.id])}
    if text_col is not None:
        fields["prompt"] = _expect(where, text_col, row[text_col], (str,), "text")
    else:
        chat = row[chat_col or "messages"]
        fields["messages"] = _json(where, chat_col or "messages", chat) if isinstance(chat, str) else chat
    fields["expected"] = _expected(source, row, where)
    try:
        return Prompt.model_validate(fields)
    except ValidationError as e:  # its last line is pydantic's URL: the first error, the column as mapped
        msg = f"{where}: {error_line(relevant(e.errors(include_url=False))[0], fields, model=Prompt)}"
        raise ValueError(msg) from None


def _expect(where: str, col: str, value: Any, types: tuple[type, ...], what: str) -> Any:
    if not isinstance(value, types) or isinstance(value, bool):
        msg = f"{where}: column {col!r} holds {type(value).__name__} {clip(value, 40)}, expected {what}"
        raise ValueError(msg)
    return value


def _json(where: str, col: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        msg = f"{where}: column {col!r} is not JSON ({e.msg} at character {e.pos + 1}): {clip(text, 40)}"
        raise ValueError(msg) from None


def _expected(source: PromptFile, row: dict[str, Any], where: str) -> Expected | None:
    spec, col = source.expected, source.expected if isinstance(source.expected, str) else "expected"
    if isinstance(spec, dict):
        [(rule, col)] = spec.items()
        if col not in row:
            msg = f"{where}: no column {col!r} for expected.{rule}"
            raise ValueError(msg)
        value = row[col]
        if value is None:
            return None
        if rule == "number" and isinstance(value, str):
            # GSM8K's answers end "#### 72": the last number in the text is the answer.
            numbers = NUMBER.findall(value)
            if not numbers:
                msg = f"{where}: column {col!r} holds no number: {value[:60]!r}"
                raise ValueError(msg)
            value = float(numbers[-1].replace(",", ""))
        value = {rule: value}
    else:
        value = row.get(col)
        if value is None:
            return None
        if isinstance(value, str):
            value = _json(where, col, value) if re.match(r"\s*\{", value) else {"exact": value}
        _expect(where, col, value, (dict,), "an object such as {number: 4}, or text (an exact answer)")
        value = {k: v for k, v in value.items() if v is not None}
    try:
        return Expected.model_validate(value)
    except ValidationError as e:
        msg = f"{where}: column {col!r}: {error_line(relevant(e.errors(include_url=False))[0], value, model=Expected)}"
        raise ValueError(msg) from None
