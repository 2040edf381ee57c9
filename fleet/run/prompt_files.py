"""Prompt sets from files: prompt files next to the manifest (JSONL, Parquet, CSV with a column
mapping, read by the shards themselves: fleet/contracts/prompt_source.py), and the built-in sets
(fleet/data/prompts/<name>.jsonl), usable by name: `prompts: {six: {builtin: smollm-six}}`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleet.contracts.inputs import check_path_text
from fleet.contracts.prompt_source import PromptFile, check, digest

BUILTIN_DIR = Path(__file__).parent.parent / "data" / "prompts"


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.jsonl"))


def read_jsonl(path: Path, set_name: str) -> list[dict[str, Any]]:
    """Rows of a prompts file; errors name the file and line."""
    if not path.is_file():
        msg = f"prompt set {set_name!r}: prompts file not found: {path}"
        raise ValueError(msg)
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            msg = f"prompt set {set_name!r}: {path}:{lineno}: not JSON ({e.msg})"
            raise ValueError(msg) from None
        if not isinstance(row, dict) or "id" not in row or not {"prompt", "messages"} & set(row):
            msg = f"prompt set {set_name!r}: {path}:{lineno}: expected an object with 'id' and 'prompt' or 'messages'"
            raise ValueError(msg)
        rows.append(row | {"id": str(row["id"])})
    return rows


def expand(name: str, spec: Any, base_dir: Path) -> Any:
    """A manifest prompt-set entry: inline (a list of prompt dicts), {builtin: ...} (read here:
    built-in sets are small) or {file: ..., <column mapping>} (checked once, then read by shards)."""
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
    except ValueError as e:
        msg = f"prompt set {str(name)[:60]!r}: {str(e).splitlines()[-1].strip().removeprefix('Value error, ')[:300]}"
        raise ValueError(msg) from None
    except (OSError, UnicodeDecodeError, pa.ArrowException) as e:  # unreadable, not UTF-8, damaged: the set's error
        msg = f"prompt set {str(name)[:60]!r}: cannot read {str(spec['file'])[:200]}: {str(e)[:120]}"
        raise ValueError(msg) from None
    return source
