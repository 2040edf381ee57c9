"""Prompts: plain text or chat messages, optionally with an expected answer and its match rule.

`is_correct` is the one place an answer is judged (prompt files and built-in sets are read by
fleet/run/prompt_files.py).
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import Field, model_validator

from fleet.contracts.base import Strict

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class Message(Strict):
    role: Literal["system", "user", "assistant"] = Field(description="Chat role.")
    content: str = Field(description="Message text.")


class Expected(Strict):
    """Exactly one rule. contains: case-insensitive substring; exact: equal after stripping
    whitespace; regex: re.search matches; number: the last number in the output equals it (the
    GSM8K convention: "2 + 2 = 4" answers 4)."""

    contains: str | None = Field(None, description="Case-insensitive substring of the output.")
    exact: str | None = Field(None, description="The whole output, whitespace-stripped.")
    regex: str | None = Field(None, description="A Python regular expression searched in the output.")
    number: float | None = Field(None, description="The last number in the output (commas ignored).")

    @model_validator(mode="after")
    def _one_rule(self) -> Expected:
        # Field by field rather than model_dump: this runs once per prompt of a checked file, and
        # model_dump was a third of the check's time (docs/measurements.md).
        rules = [name for name in RULES if getattr(self, name) is not None]
        if len(rules) != 1:
            msg = f"expected needs exactly one of contains, exact, regex, number (got {rules or 'none'})"
            raise ValueError(msg)
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as e:
                msg = f"expected.regex does not compile: {e}"
                raise ValueError(msg) from None
        return self

    def rule(self) -> str:
        """The rule as stored in the requests table: compact JSON, one key."""
        return json.dumps({k: v for k, v in self.model_dump().items() if v is not None})


# Expected's rules, in field order (what model_dump lists).
RULES = tuple(Expected.model_fields)


class Prompt(Strict):
    id: str = Field(min_length=1, description="Unique within its set.")
    prompt: str | None = Field(None, description="Text sent as is (the tokenizer adds BOS if it does so).")
    messages: list[Message] | None = Field(None, description="Chat turns, rendered with the model's chat template.")
    expected: Expected | None = Field(None, description="The right answer, for task accuracy.")

    @model_validator(mode="after")
    def _text_or_chat(self) -> Prompt:
        if (self.prompt is None) == (self.messages is None):
            msg = f"prompt {self.id!r}: give exactly one of 'prompt' or 'messages'"
            raise ValueError(msg)
        return self

    def messages_json(self) -> str | None:
        return None if self.messages is None else json.dumps([m.model_dump() for m in self.messages])


def is_correct(rule: str | None, output: str | None) -> bool | None:
    """Judge `output` by a stored rule (Expected.rule()); None when there is no rule."""
    if rule is None:
        return None
    text = output or ""
    [(kind, value)] = json.loads(rule).items()
    if kind == "contains":
        return str(value).lower() in text.lower()
    if kind == "exact":
        return text.strip() == str(value).strip()
    if kind == "regex":
        return re.search(str(value), text) is not None
    numbers = NUMBER.findall(text)
    if not numbers:
        return False
    last = float(numbers[-1].replace(",", ""))
    return abs(last - float(value)) <= 1e-6 * max(1.0, abs(float(value)))
