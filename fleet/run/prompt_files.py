"""Prompt sets from files: prompt files next to the manifest (JSONL, Parquet, CSV with a column
mapping, read by the shards themselves: fleet/contracts/prompt_source.py), and the built-in sets
(fleet/data/prompts/<name>.jsonl), usable by name: `prompts: {six: {builtin: smollm-six}}`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleet.contracts.inputs import check_path_text
from fleet.contracts.messages import error_line, relevant
from fleet.contracts.prompt_source import PromptFile, check, digest

BUILTIN_DIR = Path(__file__).parent.parent / "data" / "prompts"


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.jsonl"))


def _json_lines(path: Path, set_name: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line of a JSONL file; errors name the file and line."""
    if not path.is_file():
        msg = f"prompt set {set_name!r}: prompts file not found: {path}"
        raise ValueError(msg)
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            msg = f"prompt set {set_name!r}: {path}:{lineno}: not JSON ({e.msg})"
            raise ValueError(msg) from None


def read_jsonl(path: Path, set_name: str) -> list[dict[str, Any]]:
    """Rows of a prompts file; errors name the file and line."""
    rows = []
    for lineno, row in _json_lines(path, set_name):
        if not isinstance(row, dict) or "id" not in row or not {"prompt", "messages"} & set(row):
            msg = f"prompt set {set_name!r}: {path}:{lineno}: expected an object with 'id' and 'prompt' or 'messages'"
            raise ValueError(msg)
        rows.append(row | {"id": str(row["id"])})
    return rows


# GSM8K rows are {"question", "answer"}, the answer's last line "#### 72"; a chat model is asked the
# question as is, with the final-number convention the `number` rule judges by.
GSM8K_INSTRUCTION = "\nSolve it step by step, then give the final answer as a number on the last line."
_GSM8K_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")


def read_gsm8k(path: Path, set_name: str) -> list[dict[str, Any]]:
    """A GSM8K-format JSONL file (the benchmark's own test.jsonl works as is) as chat prompts with
    the answer after `####` as the expected number; ids are the 1-based line numbers unless given."""
    rows = []
    for lineno, row in _json_lines(path, set_name):
        final = _GSM8K_FINAL.search(str(row.get("answer", ""))) if isinstance(row, dict) else None
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or final is None:
            msg = f"prompt set {set_name!r}: {path}:{lineno}: expected GSM8K's {{question, answer: '... #### N'}}"
            raise ValueError(msg)
        content = row["question"] + GSM8K_INSTRUCTION
        rows.append(
            {
                "id": str(row.get("id", f"q{lineno:04d}")),
                "messages": [{"role": "user", "content": content}],
                "expected": {"number": float(final.group(1).replace(",", ""))},
            }
        )
    return rows


def expand(name: str, spec: Any, base_dir: Path) -> Any:
    """A manifest prompt-set entry: inline (a list of prompt dicts), {builtin: ...} (read here:
    built-in sets are small), {file: ..., format: gsm8k} (GSM8K's own rows, read here: a benchmark
    file, not a dataset) or {file: ..., <column mapping>} (checked once, then read by shards)."""
    if isinstance(spec, dict) and spec.get("format") == "gsm8k":
        if set(spec) != {"file", "format"}:
            msg = f"prompt set {str(name)[:60]!r}: format gsm8k takes only file (its columns are GSM8K's own)"
            raise ValueError(msg)
        try:  # the one check every user path gets (fleet/contracts/inputs.py)
            file = check_path_text(spec["file"])
            return read_gsm8k(base_dir / file, name)
        except (OSError, UnicodeDecodeError) as e:  # unreadable or not UTF-8: the set's error, not a crash
            msg = f"prompt set {str(name)[:60]!r}: cannot read {str(spec['file'])[:200]}: {str(e)[:120]}"
            raise ValueError(msg) from None
    if isinstance(spec, dict) and "file" in spec:
        return _prompt_file(name, spec, base_dir)
    if isinstance(spec, dict) and set(spec) == {"builtin"}:
        if not isinstance(spec["builtin"], str) or spec["builtin"] not in builtin_names():
            msg = f"prompt set {str(name)[:60]!r}: no built-in set {str(spec['builtin'])[:60]!r}; "
            msg += f"built-in sets: {', '.join(builtin_names())}"
            raise ValueError(msg)
        return read_jsonl(BUILTIN_DIR / f"{spec['builtin']}.jsonl", name)
    return spec


def _prompt_file(name: str, spec: dict[str, Any], base_dir: Path) -> PromptFile:
    """The file checked (rows counted, ids unique, every row a prompt), or, on resume (rows
    already counted), checked to be the same bytes the run started with."""
    import pyarrow as pa

    try:
        check_path_text(spec["file"])  # the one check every user path gets (fleet/contracts/inputs.py)
        source = PromptFile.model_validate(spec)
        source = source.model_copy(update={"file": (base_dir / source.file).resolve()})
        if source.rows is None:
            return check(source)
        if not source.file.is_file() or digest(source.file) != source.sha256:
            msg = f"{source.file} is not the file this run started with (sha256 {source.sha256})"
            raise ValueError(msg)
    except ValidationError as e:  # the mapping itself: its first error, the field as written
        first = error_line(relevant(e.errors(include_url=False))[0], spec)
        msg = f"prompt set {str(name)[:60]!r}: {first[:300]}"
        raise ValueError(msg) from None
    except (OSError, UnicodeDecodeError, pa.ArrowException) as e:
        # Before ValueError, which Arrow's errors are: unreadable, not UTF-8, damaged, naming the file.
        msg = f"prompt set {str(name)[:60]!r}: cannot read {str(spec['file'])[:200]}: {str(e)[:120]}"
        raise ValueError(msg) from None
    except ValueError as e:
        msg = f"prompt set {str(name)[:60]!r}: {str(e).splitlines()[-1].strip().removeprefix('Value error, ')[:300]}"
        raise ValueError(msg) from None
    return source
