"""What engines take and return, and what each capability asks of an engine.

`Engine` is the contract every backend implements: generate a shard, score a candidate's
tokens by teacher forcing, describe itself, shut down. A capability a backend declares in its
args model (fleet/contracts/backend_args.py) is a Protocol here that its engine class must satisfy;
`CAPABILITY_PROTOCOLS` pairs them, and the registry test checks every backend against it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import pyarrow as pa

    from fleet.contracts.prompts import Prompt
    from fleet.contracts.scenario import Scenario
    from fleet.contracts.spec import ModelSpec, Sampling, Shard
    from fleet.contracts.targets import Capability, TargetArgs

Positions = Literal["last", "all"]


@dataclass(frozen=True)
class Prefix:
    """A token sequence to probe as it is, not rendered from a prompt: the drill-down's prompt plus
    the output the candidate and the reference share up to their divergence (fleet/run/drill.py)."""

    id: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Generation:
    """What one shard produced: rows for the requests, tokens and shards tables."""

    requests: pa.Table
    tokens: pa.Table
    shard: pa.Table


@dataclass(frozen=True)
class ResolvedModel:
    """A model as resolved on the actor's node: the manifest entry plus where it landed."""

    spec: ModelSpec
    path: Path
    weights: str  # sha256 prefix of the weight files: tells two "same name" models apart
    revision: str | None

    @property
    def name(self) -> str:
        return self.spec.name


class RowSink(Protocol):
    """Where an actor stores a shard's rows itself, when the engines write their own (the driver hands
    it over as a call's argument; fleet/results/direct.py implements it). What it returns is all the
    driver gets back: where the files wait, and the shard's one `shards` row."""

    def generated(self, gen: Generation) -> Any:
        """Store a shard as its target generated it."""

    def scored(self, stored: Any, score: Callable[[pa.Table], pa.Table]) -> Any:
        """Score a candidate shard (`score`: requests -> SCORES rows) and store it scored; `stored`
        is how this sink finds it: what `generated` returned for it, or where it was staged."""


class Engine(ABC):
    """An inference engine living inside one actor, on one card.

    `generate` returns tables matching schema.REQUESTS/TOKENS/SHARDS (the ref_* columns
    null); `score` is teacher forcing: for each request row (prompt_token_ids, output_token_ids)
    it returns schema.SCORES rows, one per output position, from one forward pass each. With
    `twin` (a dtype), an engine that can also scores the rows with its own model cast to that dtype
    (`twin_logprob`, fleet/analysis/noise_model.py); the others leave the column null.
    """

    def __init__(self, args: TargetArgs, model: ResolvedModel, *, sampling: Sampling) -> None:
        self.args = args
        self.model = model
        self.sampling = sampling
        # Per-model overrides beat the target's own settings.
        self.dtype: str = model.spec.dtype or args.dtype
        self.tokenizer_path = model.spec.tokenizer or str(model.path)

    @abstractmethod
    def generate(self, shard: Shard) -> Generation: ...

    @abstractmethod
    def score(self, requests: pa.Table, *, k: int, twin: str | None = None) -> pa.Table: ...

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """Provenance: library versions and device names as this process sees them."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release the engine and any child processes; the actor calls it before it exits."""


@dataclass
class Completion:
    """One request's outcome, engine-neutral; `to_generation` turns a shard's worth into tables."""

    prompt: Prompt
    rendered: str  # the text the model saw: the prompt, or the messages through the chat template
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_text: str
    finish_reason: str
    logprobs: list[float]
    ranks: list[int]
    topk_ids: list[list[int]]
    topk_logprobs: list[list[float]]
    queue_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None


@dataclass(frozen=True)
class EngineStats:
    """The engine's own view of one request (vLLM RequestStateStats), when it reports one."""

    queue_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None


@dataclass(frozen=True)
class Chunk:
    """One piece of a stream: `n_tokens` new tokens; the last may carry the engine's stats and its
    own count of the prompt's tokens (a server's usage.prompt_tokens: what a text or chat prompt became)."""

    n_tokens: int
    stats: EngineStats | None = None
    n_prompt_tokens: int | None = None


@dataclass(frozen=True)
class LoadRows:
    """A level's parity prompts (a scenario's `parity:`), alone and under load: schema.LOAD_REQUESTS
    and LOAD_TOKENS rows, the reference's columns null until it scores them."""

    requests: pa.Table
    tokens: pa.Table


@dataclass(frozen=True)
class PerfResult:
    """One level of one scenario: schema.PERF_REQUESTS rows and its PERF_LEVELS row; with the
    scenario's `parity:`, its parity prompts' rows."""

    requests: pa.Table
    level: pa.Table
    parity: LoadRows | None = None


@runtime_checkable
class RunsPerf(Protocol):
    """Capability "perf": one concurrency level of a perf scenario, measured on the card; with the
    scenario's `parity:`, its `parity_prompts` alone and mid-load too (PerfResult.parity)."""

    def perf(
        self,
        scenario: Scenario,
        level: int,
        prompts: list[Prompt] | None,
        parity_prompts: list[Prompt] | None = None,
    ) -> PerfResult: ...


@runtime_checkable
class Smokes(Protocol):
    """Capability "smoke": checks of the engine's API routes, as schema.SMOKE rows."""

    def smoke(self) -> pa.Table: ...


@runtime_checkable
class ProbesLogits(Protocol):
    """Capability "probe_logits": full-vocabulary logprobs, as schema.PROBE_LOGITS rows."""

    def probe_logits(self, prompts: list[Prompt], *, prompt_set: str, positions: Positions) -> pa.Table: ...


@runtime_checkable
class ProbesLayers(Protocol):
    """Capability "probe_layers": hidden states after every layer, as schema.PROBE_LAYERS rows;
    `sublayers` adds each decoder layer's attention and MLP outputs, `twin` (a dtype) probes the
    precision twin at that dtype instead of the engine's own model."""

    def probe_layers(
        self,
        prompts: Sequence[Prompt | Prefix],
        *,
        prompt_set: str,
        positions: Positions,
        sublayers: bool = False,
        twin: str | None = None,
    ) -> pa.Table: ...


CAPABILITY_PROTOCOLS: dict[Capability, type] = {
    "perf": RunsPerf,
    "smoke": Smokes,
    "probe_logits": ProbesLogits,
    "probe_layers": ProbesLayers,
}
