"""What a perf scenario sends, beyond a fixed prompt length: token-count distributions, a
shared-prefix workload, multi-turn conversations, and a trace file replayed at its own times.

The driver validates these with the manifest (a trace file is read and checked line by line then);
the actor builds the prompts from them (actors/workloads.py) and reads the trace again with the
same `read_trace`, so a bad line fails before any engine starts, naming the file, line and field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from fleet.contracts.base import MAX_COUNT, Strict
from fleet.contracts.errors import UserError


class Lengths(Strict):
    """Token counts drawn per request from a seeded distribution (the scenario's seed)."""

    distribution: Literal["fixed", "uniform", "normal"] = Field(
        description="fixed: always `mean`; uniform: integers from `min` to `max`, each as likely; normal: "
        "round(gauss(mean, std)) clipped to [min, max]."
    )
    mean: int | None = Field(None, ge=1, le=MAX_COUNT, description="fixed: the count; normal: the mean.")
    std: float | None = Field(None, gt=0, le=MAX_COUNT, description="normal: the standard deviation.")
    min: int = Field(1, ge=1, le=MAX_COUNT, description="uniform and normal: the smallest count.")
    max: int | None = Field(None, ge=1, le=MAX_COUNT, description="uniform and normal: the largest count.")

    @model_validator(mode="after")
    def _complete(self) -> Lengths:
        need = {"fixed": ("mean",), "uniform": ("max",), "normal": ("mean", "std", "max")}[self.distribution]
        if missing := [f for f in need if getattr(self, f) is None]:
            msg = f"a {self.distribution} distribution needs {' and '.join(missing)}"
            raise ValueError(msg)
        if self.distribution != "normal" and self.std is not None:
            msg = f"std is for the normal distribution, not {self.distribution}"
            raise ValueError(msg)
        if self.max is not None and self.max < self.min:
            msg = f"max ({self.max}) is below min ({self.min})"
            raise ValueError(msg)
        return self

    @property
    def upper(self) -> int:
        """The largest count a draw can give (what the context must hold)."""
        bound = self.mean if self.distribution == "fixed" else self.max
        assert bound is not None  # _complete
        return bound


def upper(lengths: int | Lengths) -> int:
    """The largest count of a fixed count or a distribution."""
    return lengths if isinstance(lengths, int) else lengths.upper


class SharedPrefix(Strict):
    """vLLM's prefix-repetition dataset (vllm/benchmarks/datasets/datasets.py
    `PrefixRepetitionRandomDataset`): `groups` random prefixes of `prefix_tokens` tokens, each followed
    by num_requests / groups random suffixes of the scenario's input_tokens, sent in a seeded shuffle."""

    groups: int = Field(ge=1, le=MAX_COUNT, description="Distinct prefixes (vLLM's --prefix-repetition-num-prefixes).")
    prefix_tokens: int = Field(
        ge=1, le=MAX_COUNT, description="Tokens in each prefix (--prefix-repetition-prefix-len)."
    )


class MultiTurn(Strict):
    """Conversations that re-send their growing history, as vLLM's benchmarks/multi_turn does: turn k
    sends turns 1..k-1 (user message and reply) and a new user message; it is sent only once turn
    k-1 has been answered. The replies in the history are synthetic, of output_tokens tokens, so every
    turn's input length is known before anything is sent."""

    turns: int = Field(ge=2, le=1000, description="User turns per conversation; num_requests / turns conversations.")


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace: when it is due, what it sends, how much it asks back."""

    offset_s: float  # from the first request's time
    prompt: str | None
    input_tokens: int | None
    output_tokens: int | None


_TIME_FIELDS = ("timestamp", "offset")
_KNOWN = {*_TIME_FIELDS, "prompt", "input_tokens", "output_tokens"}


def read_trace(path: Path) -> list[TraceRow]:
    """A trace JSONL, one request per line: `timestamp` (seconds, any origin) or `offset` (seconds
    from the start), `prompt` (text) or `input_tokens` (a synthetic prompt of that length), and
    optionally `output_tokens`. Requests are replayed in time order; errors name file, line and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        msg = f"trace {path}: no such file"
        raise UserError(msg) from None
    except (OSError, UnicodeDecodeError) as e:
        msg = f"trace {path}: cannot read it ({type(e).__name__}: {e})"
        raise UserError(msg) from None
    rows: list[tuple[float, TraceRow]] = []
    kinds: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            kind, t, row = _row(line, f"trace {path} line {number}")
            kinds.add(kind)
            rows.append((t, row))
    if not rows:
        msg = f"trace {path}: no requests in it"
        raise UserError(msg)
    if len(kinds) > 1:
        msg = f"trace {path}: mixes timestamp and offset lines; use one of them throughout"
        raise UserError(msg)
    # Timestamps have any origin (a log's epoch seconds): the first request is due at the level's start.
    origin = min(t for t, _ in rows) if kinds == {"timestamp"} else 0.0
    ordered = sorted(rows, key=lambda r: r[0])
    return [TraceRow(t - origin, r.prompt, r.input_tokens, r.output_tokens) for t, r in ordered]


def _row(line: str, where: str) -> tuple[str, float, TraceRow]:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as e:
        msg = f"{where}: not valid JSON ({e.msg} at column {e.colno})"
        raise UserError(msg) from None
    if not isinstance(raw, dict):
        msg = f'{where}: expected an object like {{"offset": 0.5, "input_tokens": 128, "output_tokens": 64}}'
        raise UserError(msg)
    if unknown := sorted(set(raw) - _KNOWN):
        msg = f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_KNOWN))})"
        raise UserError(msg)
    times = [f for f in _TIME_FIELDS if f in raw]
    if len(times) != 1:
        msg = f"{where}: set exactly one of timestamp and offset (seconds)"
        raise UserError(msg)
    t = raw[times[0]]
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        msg = f"{where}: field {times[0]!r}: expected a number of seconds >= 0, got {json.dumps(t)[:40]}"
        raise UserError(msg)
    if ("prompt" in raw) == ("input_tokens" in raw):
        msg = f"{where}: set exactly one of prompt (text) and input_tokens (a count)"
        raise UserError(msg)
    prompt = raw.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        msg = f"{where}: field 'prompt': expected non-empty text"
        raise UserError(msg)
    counts = {f: _count(raw, f, where) for f in ("input_tokens", "output_tokens")}
    return times[0], float(t), TraceRow(0.0, prompt, counts["input_tokens"], counts["output_tokens"])


def _count(raw: dict[str, object], name: str, where: str) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        msg = f"{where}: field {name!r}: expected a whole number from 1 to {MAX_COUNT}, got {json.dumps(value)[:40]}"
        raise UserError(msg)
    return value
