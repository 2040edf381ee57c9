"""The manifest's value types that both sides use: a model, sampling, run options, how parity is
read, probes and drill-down, report options, matrix variants, and the shard (the unit of work an
engine is handed). A perf scenario is fleet/contracts/scenario.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import Field

from fleet.contracts.base import MAX_COUNT, MAX_SEED, MAX_TIMEOUT_S, DType, Name, Strict
from fleet.contracts.prompt_source import FileSlice, read_slice
from fleet.contracts.prompts import Prompt
from fleet.contracts.sources import ModelSource


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
    write: Literal["driver", "actors", "auto"] = Field(
        "auto",
        description="Who writes a shard's Parquet: the driver (the actors hand it each shard's files encoded, so "
        "every row's bytes pass through it), or the engine actors "
        "into a shared results store, handing the driver only where the files wait, committed by it "
        "(docs/cluster.md). auto: the actors when the results root is an object store (s3://), or the cluster has "
        "more than one node and the results directory is on a network file system; else the driver.",
    )
    keep_actors: bool = Field(
        True,
        description="A target's actor, once its engine shut down cleanly, is kept for the next target of the "
        "same resources and environment, which builds its engine there instead of starting a new process "
        "(fleet/run/idle_actors.py). false: a new process for every target, e.g. where an engine leaves "
        "its process or card in a state the next should not inherit.",
    )


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


class Drilldown(Strict):
    """Layer probes at every real divergence (fleet/run/drill.py, fleet/analysis/drilldown.py): where,
    in depth, a candidate's error first exceeds what its precision explains."""

    margin: float = Field(
        2.0,
        ge=1,
        le=1e6,
        description="A layer (or sub-layer) exceeds precision when its relative L2 error vs the reference is "
        "above margin x the precision twin's at that layer (and above 1e-6, float32's own floor).",
    )
    max_prompts: int = Field(
        8, ge=1, le=1000, description="Real divergences probed per model x candidate, earliest in the output first."
    )
    targets: list[str] | None = Field(
        None,
        min_length=1,
        description="hf candidates probed beside the reference and its twin (default: all): each at its own "
        "divergences, and at those of targets that give no hidden states (vLLM), as HF on the same card.",
    )


@dataclass(frozen=True)
class DrillPoint:
    """One real divergence to drill into: candidate `diverging` left the reference's greedy path on
    this prompt at output position `step`; `token_ids` is the prompt + the `step` output tokens both share."""

    diverging: str
    prompt_set: str
    prompt_id: str
    step: int
    token_ids: tuple[int, ...]


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
