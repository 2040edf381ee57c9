"""What every backend shares: its manifest args model, its and its engine contract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet.manifest import ModelSpec, Sampling
    from fleet.plan import Shard
    from fleet.prompts import Prompt

Device = Literal["cpu", "cuda", "npu"]
DType = Literal["float32", "bfloat16", "float16"]


class Strict(BaseModel):
    """Config base: unknown keys are errors, values are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetArgs(Strict):
    """Fields every target has; a backend's args model adds its own and a `kind` literal."""

    # What the backend's engine can do beyond generate/score (the scheduler asks only for these).
    perf_capable: ClassVar[bool] = False  # runs the manifest's perf scenarios: engine.perf()
    smoke_capable: ClassVar[bool] = False  # has API routes to smoke-test: engine.smoke()

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Target name, used in result paths.")
    kind: str = Field(description="Backend key; see the registry in actors/base.py.")
    device: Device = Field("cpu", description="cpu, cuda (one GPU per actor) or npu (one Ascend card per actor).")
    dtype: DType = Field("bfloat16", description="Weights and activations dtype.")
    num_cpus: float = Field(1.0, gt=0, description="Ray CPU slots the actor holds (its only resource on cpu).")
    tensor_parallel_size: int = Field(1, ge=1, description="Cards one engine spans, all on one node.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Extra Ray resources the actor needs, e.g. {'accelerator_type:910B': 0.001}."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the actor process.")
    parity: bool = Field(
        True, description="Run the parity prompts here (false: a perf-only target, e.g. dummy weights)."
    )

    def actor_env(self) -> dict[str, str]:
        """Environment the actor process starts with (backends add their defaults)."""
        return dict(self.env)

    def ray_resources(self) -> dict[str, Any]:
        """Ray options that give this target's actor its card(s): `tensor_parallel_size` of them."""
        cards = self.tensor_parallel_size
        options: dict[str, Any] = {"num_cpus": self.num_cpus}
        extra = dict(self.resources)
        if self.device == "cuda":
            options["num_gpus"] = cards
        elif self.device == "npu":
            extra["NPU"] = extra.get("NPU", 0) + cards
        if extra:
            options["resources"] = extra
        return options


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


class Engine(ABC):
    """An inference engine living inside one actor, on one card.

    `generate` returns tables matching fleet.schema.REQUESTS/TOKENS/SHARDS (the ref_* columns
    null); `score` is teacher forcing: for each request row (prompt_token_ids, output_token_ids)
    it returns fleet.schema.SCORES rows, one per output position, from one forward pass each.
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
    def score(self, requests: pa.Table, *, k: int) -> pa.Table: ...

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """Provenance: library versions and device names as this process sees them."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release the engine and any child processes; the actor calls it before it exits."""


@dataclass(frozen=True)
class Backend:
    """A registry entry: the args model and the engine class as a "module:Class" string."""

    args: type[TargetArgs]
    engine: str


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


def to_generation(
    shard: Shard, model: ResolvedModel, completions: list[Completion], *, started_at: float, wall_s: float
) -> Generation:
    """Build the requests, tokens and shards rows of one shard (ref_* columns left null)."""
    import datetime as dt
    import socket

    import pyarrow as pa

    from fleet import schema

    keys: dict[str, object] = {
        "model": shard.model,
        "model_weights": model.weights,
        "target": shard.target,
        "prompt_set": shard.prompt_set,
    }
    requests = pa.Table.from_pylist(
        [
            keys
            | {
                "prompt_id": c.prompt.id,
                "shard_id": shard.shard_id,
                "prompt": c.rendered,
                "messages": c.prompt.messages_json(),
                "expected": c.prompt.expected.rule() if c.prompt.expected else None,
                "prompt_token_ids": c.prompt_token_ids,
                "output_text": c.output_text,
                "output_token_ids": c.output_token_ids,
                "n_prompt_tokens": len(c.prompt_token_ids),
                "n_output_tokens": len(c.output_token_ids),
                "finish_reason": c.finish_reason,
                "queue_s": c.queue_s,
                "ttft_s": c.ttft_s,
                "tpot_s": c.tpot_s,
                "e2e_s": c.e2e_s,
            }
            for c in completions
        ]
    )
    n = [len(c.output_token_ids) for c in completions]
    tokens = pa.table(
        {
            **{key: [value] * sum(n) for key, value in keys.items()},
            "prompt_id": [c.prompt.id for c in completions for _ in c.output_token_ids],
            "position": [i for c in completions for i in range(len(c.output_token_ids))],
            "token_id": [t for c in completions for t in c.output_token_ids],
            "logprob": [x for c in completions for x in c.logprobs],
            "rank": [x for c in completions for x in c.ranks],
            "topk_ids": [x for c in completions for x in c.topk_ids],
            "topk_logprobs": [x for c in completions for x in c.topk_logprobs],
        }
    )
    shard_row = pa.Table.from_pylist(
        [
            keys
            | {
                "shard_id": shard.shard_id,
                "n_requests": len(completions),
                "n_output_tokens": sum(n),
                "started_at": dt.datetime.fromtimestamp(started_at, tz=dt.UTC),
                "wall_s": wall_s,
                "hostname": socket.gethostname(),
            }
        ]
    )
    return Generation(
        schema.conform(requests, schema.REQUESTS),
        schema.conform(tokens, schema.TOKENS),
        schema.conform(shard_row, schema.SHARDS),
    )


def scores_table(rows: list[dict[str, object]]) -> pa.Table:
    """SCORES rows (prompt_id, position, ref_*) as a table of the declared schema."""
    import pyarrow as pa

    from fleet import schema

    return schema.conform(pa.Table.from_pylist(rows), schema.SCORES) if rows else schema.SCORES.empty_table()
