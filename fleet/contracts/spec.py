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
    write: Literal["driver", "actors", "auto"] = Field(
        "auto",
        description="Who writes a shard's Parquet: the driver (every row passes through it), or the engine actors "
        "into a shared results store, handing the driver only where the files wait, committed by it "
        "(docs/cluster.md). auto: the actors when the results root is an object store (s3://), or the cluster has "
        "more than one node and the results directory is on a network file system; else the driver.",
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

    def met(self, row: dict[str, Any]) -> bool:
        """Whether one perf_requests row meets every limit: the rule fleet/analysis/perf.py applies to a
        whole table (a sweep judges its probes with it as it runs, actors/sweep.py)."""
        if row.get("error") is not None:
            return False
        values: dict[str, float | None] = {"ttft_s": row.get("ttft_s"), "tpot_s": row.get("tpot_s") or 0.0}
        values["e2e_s"] = row.get("e2e_s")
        limits = {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s}
        return all(limit is None or ((v := values[k]) is not None and v <= limit) for k, limit in limits.items())

    @model_validator(mode="after")
    def _some_limit(self) -> Slo:
        if self.ttft_s is None and self.tpot_s is None and self.e2e_s is None:
            raise ValueError("set at least one of ttft_s, tpot_s and e2e_s")
        return self


class LoadParity(Strict):
    """Parity under load (fleet/analysis/load_parity.py): at each level of a scenario, a prompt set
    is sent greedily with top-k logprobs in the middle of the load, and alone before the load, then
    scored by the reference like any candidate shard."""

    prompt_set: Name = Field(
        description="Prompt set sent under load (every target's parity runs it too, the reference's greedy "
        "path comes from there); keep it short: its prompts add to the level's load."
    )
    at: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Share of the level's measured requests sent before the parity prompts go, all at once "
        "(0.5: the middle of the load).",
    )


class Ramp(Strict):
    """A request rate that grows over a level, as vLLM's `--ramp-up-strategy` (actors/arrivals.py)."""

    strategy: Literal["linear", "exponential"] = Field(
        description="Request i's rate: start + (end - start) p (linear) or start (end / start)^p "
        "(exponential), p = i / (n - 1)."
    )
    start_rps: float = Field(gt=0, le=MAX_COUNT, description="Rate of the first request, req/s.")
    end_rps: float = Field(gt=0, le=MAX_COUNT, description="Rate of the last request, req/s (at least start_rps).")

    @model_validator(mode="after")
    def _rises(self) -> Ramp:
        if self.end_rps < self.start_rps:
            msg = f"end_rps ({self.end_rps:g}) must be at least start_rps ({self.start_rps:g})"
            raise ValueError(msg)
        return self


class Sweep(Strict):
    """Find the highest request rate that still meets the SLO: a closed loop at the level measures
    the most the target serves, then open-loop probes bisect between `floor_rps` and that rate."""

    floor_rps: float = Field(gt=0, le=MAX_COUNT, description="The lowest rate probed, req/s.")
    min_share: float = Field(
        0.9, gt=0, le=1, description="A rate meets the SLO when at least this share of its requests do (slo_share)."
    )
    steps: int = Field(4, ge=1, le=20, description="Bisection probes after the floor: the answer is within "
        "(max - floor) / 2^steps of the highest passing rate.")  # fmt: skip

    @property
    def runs(self) -> int:
        """Runs of a level: the closed loop, the floor, then the bisection steps (fewer when one decides)."""
        return 2 + self.steps


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
        None,
        gt=0,
        le=MAX_COUNT,
        description="Open loop: arrivals per second (see arrival, burstiness), capped by the level; unset (and no "
        "ramp, no sweep): closed loop.",
    )
    burstiness: float = Field(
        1.0,
        gt=0,
        le=1000,
        description="With request_rate: gamma-distributed gaps of this shape, mean 1/request_rate (vLLM's "
        "--burstiness): 1 is Poisson, below 1 burstier, above 1 more even.",
    )
    arrival: Literal["random", "constant"] = Field(
        "random",
        description="With request_rate or ramp: random gaps (gamma of shape burstiness, 1: Poisson), or "
        "evenly spaced ones, 1/rate each (vLLM's --burstiness inf).",
    )
    ramp: Ramp | None = Field(
        None, description="Instead of request_rate: a rate that grows from request to request (vLLM's ramp-up)."
    )
    sweep: Sweep | None = Field(
        None, description="Search each level for the highest rate meeting the slo (needs slo; no request_rate, ramp)."
    )
    clients: int = Field(
        1,
        ge=1,
        le=64,
        description="Client processes sending the load (Ray actors, spread over nodes), each every k-th arrival "
        "of one schedule; above 1 only for targets other processes reach (vllm-server, endpoint).",
    )
    client_cpus: float = Field(
        1.0,
        ge=0,
        le=1024,
        description="With clients above 1: CPUs each client actor reserves in Ray (1: the core one client can "
        "use; 0 on a machine whose cores the target holds).",
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed for synthetic prompts and arrival times.")
    targets: list[str] | None = Field(
        None, min_length=1, description="Targets to run it on (default: every target whose kind can run perf)."
    )
    slo: Slo | None = Field(None, description="Per-request limits: each level then reports goodput against them.")
    parity: LoadParity | None = Field(
        None,
        description="Parity under load: a prompt set sent greedily with logprobs mid-load at each level, and "
        "alone (concurrency 1) before it; compared with the reference and with itself alone (docs/load-parity.md).",
    )

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
        if self.ramp is not None and self.request_rate is not None:
            raise ValueError("set request_rate or ramp, not both (a ramp sets the rate of every request)")
        if self.sweep is not None and (self.slo is None or self.request_rate is not None or self.ramp is not None):
            raise ValueError("a sweep needs an slo and chooses the rates itself: set slo, unset request_rate and ramp")
        if self.clients > 1 and self.parity is not None:
            msg = "parity under load rides the engine's own client: set clients: 1 with parity"
            raise ValueError(msg)
        if self.clients > min(self.concurrency):
            msg = f"clients ({self.clients}) must not exceed the lowest concurrency level ({min(self.concurrency)})"
            raise ValueError(msg)
        if self.trace is not None and (self.request_rate is not None or self.ramp is not None or self.sweep):
            msg = "a trace's requests are due at the trace's own offsets: unset request_rate, ramp and sweep"
            raise ValueError(msg)
        if self.multi_turn is not None and (self.clients > 1 or self.sweep is not None):
            msg = (
                "multi_turn sends each turn after the previous one is answered, within one client's run: "
                "set clients: 1 and no sweep"
            )
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
