"""Targets: the fields every target has (TargetArgs) and what an engine can do beyond generate and
score (Capability).

Each backend's args model extends TargetArgs (fleet/contracts/backend_args.py) and declares its
capabilities there; the registry pairs it with its engine class under one `kind`
(fleet/contracts/backends.py).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from fleet.contracts.base import MAX_NAME, Device, DType, Name, Strict
from fleet.contracts.inputs import is_secret_name
from fleet.contracts.spec import ProbeKind

# What an engine can do beyond generate/score/describe/shutdown; the scheduler asks only for these.
#   perf: runs the manifest's perf scenarios; smoke: has API routes to smoke-test;
#   probe_logits / probe_layers: the deep parity probes (full-vocabulary logprobs, hidden states).
Capability = Literal["perf", "smoke", "probe_logits", "probe_layers"]
CAPABILITIES: tuple[Capability, ...] = ("perf", "smoke", "probe_logits", "probe_layers")


EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=MAX_NAME)]


class TargetArgs(Strict):
    """Fields every target has; a backend's args model adds its own and a `kind` literal."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    # Keys a manifest's target may also hold, expanded into targets before validation
    # (fleet/run/matrix.py): listed where an unknown key gets its closest allowed one.
    expanded_keys: ClassVar[dict[str, str]] = {
        "matrix": "Variants over settings, {setting: [values, ...]}: one target per combination, named "
        "`NAME.SETTING-VALUE...` (a feature matrix).",
        "repeat": "1-8: adds copies `NAME.repeat-2`... of this target, to measure its noise floor.",
    }
    # The engine runs torch in the actor's own process, so the actor sets torch's threads.
    runs_torch: ClassVar[bool] = False

    name: Name = Field(description="Target name, used in result paths.")
    kind: str = Field(description="Backend key; see BACKENDS in fleet/contracts/backends.py.")
    device: Device = Field("cpu", description="cpu, cuda (one GPU per actor) or npu (one Ascend card per actor).")
    dtype: DType = Field("bfloat16", description="Weights and activations dtype.")
    num_cpus: float = Field(1.0, gt=0, le=1024, description="Ray CPU slots the actor holds (its only resource on cpu).")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="Cards each pipeline stage spans, all on one node.")
    pipeline_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="Pipeline stages; above 1 the engine spans nodes (one Ray bundle per card, vLLM's Ray executor).",
    )
    resources: dict[Annotated[str, Field(min_length=1, max_length=MAX_NAME)], Annotated[float, Field(ge=0, le=1e6)]] = (
        Field(
            default_factory=dict,
            description="Extra Ray resources the actor needs, e.g. {'accelerator_type:910B': 0.001}.",
        )
    )
    env: dict[EnvName, Annotated[str, Field(max_length=32768, pattern=r"^[^\x00]*$")]] = Field(
        default_factory=dict, description="Extra environment for the actor process."
    )
    parity: bool = Field(
        True, description="Run the parity prompts here (false: a perf-only target, e.g. dummy weights)."
    )
    after: Name | None = Field(
        None,
        description="Start only once this earlier candidate target has finished and passed (it started, its "
        "smoke checks passed, none of its work failed, and, once the reference has scored its rows, every gate "
        "that checks it passed); otherwise this target is recorded as not run. The playbook's 'dummy-weight "
        "smoke first, real weights only if it passed'.",
    )

    @field_validator("env")
    @classmethod
    def _no_secrets_in_env(cls, env: dict[str, str]) -> dict[str, str]:
        # The manifest is recorded whole in run.json: a token written here would be stored with it.
        secret = sorted(k for k in env if is_secret_name(k))
        if secret:
            msg = f"{', '.join(k[:40] for k in secret)}: looks like a credential, and the manifest is recorded "
            msg += "in run.json; set it in the environment Ray workers start with instead"
            raise ValueError(msg)
        return env

    def can(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def for_probes(self, probes: set[ProbeKind]) -> TargetArgs:
        """This target as built when it runs the given probes ("logits", "layers"); most need no change."""
        return self

    def actor_env(self) -> dict[str, str]:
        """Environment the actor process starts with (backends add their defaults)."""
        return dict(self.env)

    @property
    def cards(self) -> int:
        """Cards (on cpu: ranks) one engine of this target spans."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def spans_nodes(self) -> bool:
        """An engine over several nodes: its actor holds no card, vLLM's Ray workers hold one each."""
        return self.pipeline_parallel_size > 1

    @property
    def executor(self) -> Literal["uni", "mp", "ray"]:
        """vLLM's distributed executor for this placement, chosen here and never left to vLLM:
        inside a placement group vLLM would pick its Ray executor, which refuses a bundle holding
        several cards. One card: in-process; several on one node: vLLM's own processes inside the
        actor that holds them; several nodes: Ray workers in the bundles fleet reserved."""
        return "ray" if self.spans_nodes else "mp" if self.cards > 1 else "uni"

    @model_validator(mode="after")
    def _parallel_fits_device(self) -> TargetArgs:
        if self.spans_nodes and self.device == "cpu":
            # vllm/platforms/cpu.py leaves ray_device_key empty: vLLM's Ray executor refuses CPU.
            msg = "pipeline_parallel_size > 1 runs on vLLM's Ray executor, which has no cpu device: use npu or cuda"
            raise ValueError(msg)
        if self.device == "cpu" and self.cards > 1 and self.num_cpus < self.cards:
            msg = f"on cpu each of the {self.cards} ranks needs a core of its own: num_cpus must be >= {self.cards}"
            raise ValueError(msg)
        return self
