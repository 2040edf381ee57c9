"""A perf scenario: the load pattern a perf-capable target runs at each concurrency level (what is
sent, how much comes back, how often), with its per-request SLO, rate ramp, SLO sweep and parity
under load. The load generator that runs one is actors/loadgen.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from fleet.contracts.base import MAX_COUNT, MAX_SEED, Name, Strict, UserPath
from fleet.contracts.errors import UserError
from fleet.contracts.workload import Lengths, MultiTurn, SharedPrefix, read_trace, upper

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
        # Not their defaults (a resolved manifest, as run.json keeps it for --resume, spells those out).
        gaps = [
            name for name, default in (("arrival", "random"), ("burstiness", 1.0)) if getattr(self, name) != default
        ]
        if gaps and self.request_rate is None and self.ramp is None and self.sweep is None:
            # Otherwise ignored without a word: a closed loop sends on answers, a trace at its own times.
            sends = "at the trace's own offsets" if self.trace is not None else "closed loop, each on an answer"
            msg = f"{' and '.join(gaps)} shape the gaps of request_rate, ramp or sweep; this scenario sends {sends}"
            raise ValueError(msg)
        if self.multi_turn is not None and (self.clients > 1 or self.sweep is not None):
            msg = (
                "multi_turn sends each turn after the previous one is answered, within one client's run: "
                "set clients: 1 and no sweep"
            )
            raise ValueError(msg)
        return self

    @property
    def client_actor_cpus(self) -> float:
        """The CPUs its client actors hold beside the target's own while a level runs (0: the load
        goes out from the target's actor, or its clients reserve none)."""
        return self.clients * self.client_cpus if self.clients > 1 else 0.0

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
