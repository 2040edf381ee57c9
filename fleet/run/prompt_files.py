"""Prompt sets from files: JSONL prompt files next to the manifest, and the built-in sets
(fleet/data/prompts/<name>.jsonl), usable by name: `prompts: {six: {builtin: smollm-six}}`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

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


# GSM8K rows are {"question", "answer"}, the answer's last line "#### 72"; a chat model is asked the
# question as is, with the final-number convention the `number` rule judges by.
GSM8K_INSTRUCTION = "\nSolve it step by step, then give the final answer as a number on the last line."
_GSM8K_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")


def read_gsm8k(path: Path, set_name: str) -> list[dict[str, Any]]:
    """A GSM8K-format JSONL file (the benchmark's own test.jsonl works as is) as chat prompts with
    the answer after `####` as the expected number; ids are the 1-based line numbers unless given."""
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
    """A manifest prompt-set entry as a list of prompt dicts: inline, {file: ...} (fleet's rows, or
    `format: gsm8k`) or {builtin: ...}."""
    if isinstance(spec, dict) and set(spec) == {"file"}:
        return read_jsonl(base_dir / spec["file"], name)
    if isinstance(spec, dict) and set(spec) == {"file", "format"}:
        if spec["format"] != "gsm8k":
            msg = f"prompt set {name!r}: unknown format {spec['format']!r}; formats: gsm8k (default: fleet's rows)"
            raise ValueError(msg)
        return read_gsm8k(base_dir / spec["file"], name)
    if isinstance(spec, dict) and set(spec) == {"builtin"}:
        if spec["builtin"] not in builtin_names():
            msg = (
                f"prompt set {name!r}: no built-in set {spec['builtin']!r}; built-in sets: {', '.join(builtin_names())}"
            )
            raise ValueError(msg)
        return read_jsonl(BUILTIN_DIR / f"{spec['builtin']}.jsonl", name)
    return spec
