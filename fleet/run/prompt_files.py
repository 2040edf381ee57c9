"""Prompt sets from files: JSONL prompt files next to the manifest, and the built-in sets
(fleet/data/prompts/<name>.jsonl), usable by name: `prompts: {six: {builtin: smollm-six}}`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleet.contracts.inputs import check_path_text

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
    """A manifest prompt-set entry as a list of prompt dicts: inline, {file: ...} or {builtin: ...}."""
    if isinstance(spec, dict) and set(spec) == {"file"}:
        try:  # the one check every user path gets (fleet/contracts/inputs.py)
            file = check_path_text(spec["file"])
        except ValueError as e:
            msg = f"prompt set {str(name)[:60]!r}: file: {e}"
            raise ValueError(msg) from None
        try:
            return read_jsonl(base_dir / file, name)
        except (OSError, UnicodeDecodeError) as e:  # unreadable or not UTF-8: the set's error, not a crash
            msg = f"prompt set {str(name)[:60]!r}: cannot read {str(file)[:200]}: {str(e)[:120]}"
            raise ValueError(msg) from None
    if isinstance(spec, dict) and set(spec) == {"builtin"}:
        if not isinstance(spec["builtin"], str) or spec["builtin"] not in builtin_names():
            msg = f"prompt set {str(name)[:60]!r}: no built-in set {str(spec['builtin'])[:60]!r}; "
            msg += f"built-in sets: {', '.join(builtin_names())}"
            raise ValueError(msg)
        return read_jsonl(BUILTIN_DIR / f"{spec['builtin']}.jsonl", name)
    return spec
