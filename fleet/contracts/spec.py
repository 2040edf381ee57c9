"""The manifest's value types that both sides use: a model, sampling, run options, probes,
perf scenarios, and the shard (the unit of work an engine is handed)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from fleet.contracts.base import MAX_COUNT, MAX_SEED, MAX_TIMEOUT_S, DType, Name, Strict, UserPath
from fleet.contracts.errors import UserError
from fleet.contracts.prompt_source import FileSlice, read_slice
from fleet.contracts.prompts import Prompt
from fleet.contracts.sources import ModelSource
from fleet.contracts.workload import Lengths, MultiTurn, SharedPrefix, read_trace, upper


class ModelSpec(Strict):
    name: Name = Field(description="Model name, used in result paths.")
    source: ModelSource = Field(
        description="Where the weights come from (kind: path | synthetic | hf | modelscope | gguf)."
    )
    max_model_len: int | None = Field(
        None, ge=16, le=1 << 24, description="Context length for every target of this model."
    )
    dtype: DType | None = Field(None, description="Overrides every target's dtype for this model.")
    tokenizer: str | None = Field(
        None, min_length=1, max_length=4096, description="Tokenizer directory or id, when not the model's own."
    )
    trust_remote_code: bool = Field(False, description="Run code shipped with the model (off unless set).")


class Sampling(Strict):
    temperature: float = Field(0.0, ge=0, le=100, description="0 is greedy, the only mode parity is defined for.")
    max_tokens: int = Field(32, ge=1, le=MAX_COUNT, description="Tokens generated per prompt.")
    logprobs: int = Field(5, ge=1, le=20, description="Top-k logprobs recorded per position (vLLM caps at 20).")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Sampling seed when temperature > 0.")


class RunOptions(Strict):
    shard_size: int = Field(
        16, ge=1, le=MAX_COUNT, description="Prompts per shard: the unit of dispatch, retry and writing."
    )
    shard_timeout_s: float = Field(
        1800, gt=0, le=MAX_TIMEOUT_S, description="A shard (or its scoring) running longer is retried."
    )
    start_timeout_s: float = Field(
        1800, gt=0, le=MAX_TIMEOUT_S, description="Model download + engine start longer than this fails."
    )
    max_attempts: int = Field(3, ge=1, le=100, description="Tries per shard before it is recorded as failed.")


def _default_allowance() -> dict[DType, float]:
    return {"float32": 10.0, "bfloat16": 1.0, "float16": 1.0}


class ParityOptions(Strict):
    """How the parity verdicts read the numbers (fleet/analysis/divergence.py)."""

    near_tie_nats: float | None = Field(
        None,
        ge=0,
        le=10,
        description="A first divergence whose reference margin is within this many nats (and whose tokens are "
        "in each other's top-k) is a near tie; unset: the candidate's noise model (its precision twin's p99 "
        "|dlogp| times the dtype's allowance).",
    )
    twin: bool = Field(
        True,
        description="An hf reference also scores each candidate's tokens with its own model cast to the "
        "candidate's dtype (other attention kernel): the noise a correct implementation shows at that precision.",
    )
    allowance: dict[DType, float] = Field(
        default_factory=_default_allowance,
        description="The factor on the twin's noise a candidate of each dtype may show: float32 10 (its error "
        "is kernel order, which implementations differ in by a few x), 16-bit 1 (rounding dominates).",
    )


ProbeKind = Literal["logits", "layers"]  # the fields of Probes, and the names of their tables
PROBE_KINDS: tuple[ProbeKind, ...] = ("logits", "layers")


class Probe(Strict):
    """An opt-in probe on one prompt set (it costs more than sampled-token logprobs)."""

    prompt_set: Name = Field(description="Prompt set to probe (keep it short: full vectors are stored).")
    positions: Literal["last", "all"] = Field("last", description="The last prompt position, or every one.")
    targets: list[str] | None = Field(None, min_length=1, description="Targets to probe (default: all that can).")


class Probes(Strict):
    logits: Probe | None = Field(None, description="Full-vocabulary log-probabilities (hf and vllm targets).")
    layers: Probe | None = Field(None, description="Hidden states after every layer (hf targets, hf reference).")


# The seed adaptation reports whose shape `fleet report` can print (fleet/report/layouts/NAME.yaml lays each out).
ReportLayout = Literal["001-llama-3.2-3b", "002-qwen2.5-0.5b", "003-qwen-7b", "004-openelm-3b"]
REPORT_LAYOUTS: tuple[ReportLayout, ...] = ("001-llama-3.2-3b", "002-qwen2.5-0.5b", "003-qwen-7b", "004-openelm-3b")


class ReportOptions(Strict):
    layout: ReportLayout | None = Field(
        None,
        description="Also print the sections of this seed adaptation report, in its order and with its "
        "column names (manifests/reports/); unset: the standard report only.",
    )


class Variant(Strict):
    base: str = Field(description="The target whose matrix made this variant.")
    settings: dict[str, Any] = Field(description="The matrix values of this variant.")


_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]")


def setting_label(value: Any) -> str:
    """A matrix value as it appears in a variant's name and in reports."""
    # bool before anything else: True == 1, so a lookup table would name tensor_parallel_size 1 "true".
    text = ("true" if value else "false") if isinstance(value, bool) else "null" if value is None else str(value)
    return _NOT_NAME.sub("_", text)


MAX_CONCURRENCY = 4096


class Slo(Strict):
    """Per-request service-level objectives; a request meets them when it completed and each set
    limit holds (inclusive), as vLLM's `--goodput` judges (fleet/analysis/perf.py)."""

    ttft_s: float | None = Field(None, gt=0, le=86400, description="Time to first token, seconds, at most.")
    tpot_s: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="Time per output token after the first, seconds, at most (one-token outputs: 0).",
    )
    e2e_s: float | None = Field(None, gt=0, le=86400, description="Send to last token, seconds, at most.")

    @model_validator(mode="after")
    def _some_limit(self) -> Slo:
        if self.ttft_s is None and self.tpot_s is None and self.e2e_s is None:
            raise ValueError("set at least one of ttft_s, tpot_s and e2e_s")
        return self


class Scenario(Strict):
    """A load pattern run at each concurrency level: what is sent, how much comes back, how often."""

    name: Name = Field(description="Scenario name, used in results.")
    concurrency: list[int] = Field(
        min_length=1, max_length=64, description="Levels: the most requests in flight at once."
    )
    input_tokens: int | Lengths | None = Field(
        None,
        description="Synthetic prompts of exactly this many tokens, or of counts drawn from a distribution "
        "({distribution: uniform, min, max} | {distribution: normal, mean, std, min, max}), counted as the model "
        "sees them: after the chat template with send: chat.",
    )
    prompt_set: str | None = Field(None, description="Or: prompts from this set, cycled to num_requests.")
    trace: UserPath | None = Field(
        None,
        description="Or: a JSONL trace replayed at its own times, one request a line: timestamp (seconds) or "
        "offset (seconds from the start), prompt (text) or input_tokens, optional output_tokens; relative to the "
        "manifest. Its first num_requests lines (in time order) are sent at every level.",
    )
    output_tokens: int | Lengths = Field(
        description="Tokens generated per request, or a distribution of counts (as input_tokens)."
    )
    ignore_eos: bool = Field(
        True,
        description="Generate exactly output_tokens (vLLM's ignore_eos); false: output_tokens is a cap and the "
        "model may stop earlier (free output).",
    )
    send: Literal["ids", "text", "chat"] = Field(
        "ids",
        description="How prompts go to HTTP targets: ids (token ids to /completions), text (text built to encode "
        "to exactly the requested count, to /completions), chat (one user message to /chat/completions, exactly "
        "the requested count after the chat template). Offline engines get the same token ids.",
    )
    shared_prefix: SharedPrefix | None = Field(
        None, description="Groups of synthetic prompts sharing a prefix (vLLM's prefix-repetition dataset)."
    )
    multi_turn: MultiTurn | None = Field(
        None, description="Synthetic conversations re-sending their history (vLLM's benchmarks/multi_turn)."
    )
    num_requests: int = Field(ge=1, le=MAX_COUNT, description="Measured requests per level.")
    warmup_requests: int = Field(4, ge=0, le=MAX_COUNT, description="Unrecorded requests sent first at each level.")
    request_rate: float | None = Field(
        None, gt=0, le=MAX_COUNT, description="Poisson arrivals per second, capped by the level; unset: closed loop."
    )
    burstiness: float = Field(
        1.0,
        gt=0,
        le=1000,
        description="With request_rate: gamma-distributed gaps of this shape, mean 1/request_rate (vLLM's "
        "--burstiness): 1 is Poisson, below 1 burstier, above 1 more even.",
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed for synthetic prompts and arrival times.")
    targets: list[str] | None = Field(
        None, min_length=1, description="Targets to run it on (default: every target whose kind can run perf)."
    )
    slo: Slo | None = Field(None, description="Per-request limits: each level then reports goodput against them.")

    @field_validator("trace")
    @classmethod
    def _trace_path(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        """Relative to the manifest (read and checked with the whole scenario, in `_one_prompt_source`)."""
        return None if value is None else (Path((info.context or {}).get("base_dir", Path.cwd())) / value).resolve()

    @model_validator(mode="after")
    def _one_prompt_source(self) -> Scenario:
        sources = [n for n in ("input_tokens", "prompt_set", "trace") if getattr(self, n) is not None]
        if len(sources) != 1:
            msg = "set exactly one of input_tokens (synthetic prompts), prompt_set and trace"
            raise ValueError(msg + (f" (got {', '.join(sources)})" if sources else ""))
        if any(not 1 <= c <= MAX_CONCURRENCY for c in self.concurrency):
            msg = f"concurrency levels must be from 1 to {MAX_CONCURRENCY} (got {self.concurrency})"
            raise ValueError(msg)
        if self.shared_prefix and self.multi_turn:
            raise ValueError("set at most one of shared_prefix and multi_turn")
        split: list[tuple[str, int]] = []  # requests per group or conversation must divide num_requests
        if self.shared_prefix:
            split.append(("shared_prefix.groups", self.shared_prefix.groups))
        if self.multi_turn:
            split.append(("multi_turn.turns", self.multi_turn.turns))
        for what, per in split:
            if self.input_tokens is None:
                msg = f"{what.split('.')[0]} builds synthetic prompts: set input_tokens, not a prompt set or trace"
                raise ValueError(msg)
            if self.num_requests % per:
                raise ValueError(f"num_requests ({self.num_requests}) must be a multiple of {what} ({per})")
        if self.send != "ids" and self.prompt_set is not None:
            raise ValueError("send: text or chat is for synthetic prompts and traces; a prompt set goes as ids")
        if self.trace is not None:
            try:
                lines = len(read_trace(self.trace))
            except UserError as e:
                raise ValueError(str(e)) from None
            if lines < self.num_requests:
                msg = f"trace {self.trace} holds {lines} requests, fewer than num_requests ({self.num_requests})"
                raise ValueError(msg)
        return self

    @property
    def longest_request(self) -> int | None:
        """The most tokens (prompt + output) one synthetic request can need; None when prompts come from a
        set or a trace (only the engine's tokenizer counts those). Chat templating adds no tokens beyond
        input_tokens: the count is taken after it."""
        if self.input_tokens is None:
            return None
        out, new = upper(self.output_tokens), upper(self.input_tokens)
        if self.shared_prefix is not None:
            return self.shared_prefix.prefix_tokens + new + out
        if self.multi_turn is not None:
            return self.multi_turn.turns * new + (self.multi_turn.turns - 1) * out + out
        return new + out


@dataclass(frozen=True)
class Shard:
    """A chunk of one prompt set for one model x target. Prompts from a file travel as their
    `rows` (file and row range) and are read where the shard runs (`loaded`), so the driver
    never holds them."""

    model: str
    target: str
    prompt_set: str
    index: int
    prompts: tuple[Prompt, ...]
    rows: FileSlice | None = None

    def loaded(self) -> Shard:
        """This shard with its prompts in hand (read from its file slice, if it has one)."""
        if self.rows is None:
            return self
        return replace(self, prompts=tuple(read_slice(self.rows)), rows=None)

    @property
    def shard_id(self) -> str:
        return f"{self.model}/{self.target}/{self.prompt_set}/{self.index:05d}"
