"""What a manifest may say: models x prompt sets x targets and the run's options, as one pydantic
model whose validators check the parts against each other (names, duplicates, what each target
kind can run), plus what the run asks of a valid one (the targets a probe runs on, a prompt set
read whole). Reading a file into one is fleet/run/manifest_file.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from fleet.contracts.backends import BACKENDS
from fleet.contracts.base import Name, Strict
from fleet.contracts.gates import Gate
from fleet.contracts.prompt_source import CHECK_ROWS, PromptFile, chunks, read_slice
from fleet.contracts.prompts import Prompt
from fleet.contracts.scenario import Scenario
from fleet.contracts.spec import (
    PROBE_KINDS,
    Drilldown,
    ModelSpec,
    ParityOptions,
    ProbeKind,
    Probes,
    ReportOptions,
    RunOptions,
    Sampling,
    Variant,
)
from fleet.contracts.targets import Capability, TargetArgs
from fleet.run.matrix import expand_targets
from fleet.run.prompt_files import expand

# Target kinds served over HTTP, which a scenario's client actors (Scenario.clients) can reach from any node.
REMOTE_KINDS = ("vllm-server", "endpoint")


def probe_capability(kind: ProbeKind) -> Capability:
    """The capability a target needs to run the `kind` probe."""
    return "probe_logits" if kind == "logits" else "probe_layers"


def _target_union() -> Any:
    kinds = tuple(backend.args for backend in BACKENDS.values())
    return Annotated[kinds[0] if len(kinds) == 1 else _union(kinds), Field(discriminator="kind")]


def _union(types: tuple[type, ...]) -> Any:
    result: Any = types[0]
    for t in types[1:]:
        result = result | t
    return result


if TYPE_CHECKING:
    Target = TargetArgs
else:  # a union over the registered args models, discriminated on `kind`
    Target = _target_union()


class Manifest(Strict):
    models: list[ModelSpec] = Field(min_length=1, description="Models to evaluate.")
    prompts: dict[Name, list[Prompt] | PromptFile] = Field(
        min_length=1,
        description="Prompt sets by name: a list of prompts, {builtin: NAME}, or a file read by the shards: "
        "{file: prompts.jsonl | .parquet | .csv, id: COLUMN, prompt: COLUMN, expected: {number: COLUMN}}.",
    )
    targets: list[Target] = Field(min_length=1, description="Where and how each model runs.")
    reference: str = Field(description="Name of the target the others are compared with.")
    sampling: Sampling = Field(default_factory=Sampling, description="Decoding settings, shared by all targets.")
    run: RunOptions = Field(default_factory=RunOptions, description="How the work is cut and dispatched.")
    parity: ParityOptions = Field(default_factory=ParityOptions, description="How parity verdicts are read.")
    probes: Probes = Field(default_factory=Probes, description="Deep parity probes, opt-in.")
    drilldown: Drilldown | None = Field(
        None,
        description="true (or its options): a layer probe at every real divergence's prefix on the reference, its "
        "precision twin and hf candidates, naming the first layer whose error exceeds precision (docs/metrics.md).",
    )
    variants: dict[str, Variant] = Field(
        default_factory=dict, description="Filled from targets' `matrix:` (variant name -> base and settings)."
    )
    repeats: dict[str, str] = Field(
        default_factory=dict, description="Filled from targets' `repeat:` (copy name -> the target it repeats)."
    )
    perf: list[Scenario] = Field(
        default_factory=list, description="Performance scenarios, run on every perf-capable target (actors/perf.py)."
    )
    gates: list[Gate] = Field(
        default_factory=list, description="Pass/fail thresholds per model x candidate target (fleet/gates.py)."
    )
    report: ReportOptions = Field(default_factory=ReportOptions, description="How `fleet report` lays the run out.")

    @model_validator(mode="before")
    @classmethod
    def _expand_matrix(cls, data: Any) -> Any:
        """A target with `matrix: {key: [values]}` becomes one target per combination; one with
        `repeat: N` is followed by N - 1 copies of itself."""
        if not isinstance(data, dict) or not isinstance(data.get("targets"), list):
            return data
        if not any(isinstance(t, dict) and ("matrix" in t or "repeat" in t) for t in data["targets"]):
            return data
        if not all(isinstance(t, dict) for t in data["targets"]):
            return data  # the per-target validation names the entry that is not a mapping
        expansion = expand_targets(data["targets"])
        variants = {n: {"base": b, "settings": expansion.settings[n]} for n, b in expansion.variants_of.items()}
        return data | {"targets": expansion.targets, "variants": variants, "repeats": expansion.repeats}

    @field_validator("drilldown", mode="before")
    @classmethod
    def _drilldown_switch(cls, value: Any) -> Any:
        """`drilldown: true` is the defaults, `false` is off."""
        if isinstance(value, bool):
            return {} if value else None
        return value

    @field_validator("prompts", mode="before")
    @classmethod
    def _load_prompt_files(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, dict):
            return value
        base = (info.context or {}).get("base_dir", Path.cwd())
        return {name: expand(name, spec, base) for name, spec in value.items()}

    @field_validator("prompts")
    @classmethod
    def _unique_prompt_ids(cls, value: dict[str, list[Prompt] | PromptFile]) -> dict[str, list[Prompt] | PromptFile]:
        for name, prompt_set in value.items():
            if isinstance(prompt_set, PromptFile):
                continue  # checked when it was read (fleet/contracts/prompt_source.py)
            ids = [p.id for p in prompt_set]
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            if dupes:
                msg = f"prompt set {name!r} has duplicate ids: {', '.join(dupes)}"
                raise ValueError(msg)
            if not prompt_set:
                msg = f"prompt set {name!r} is empty"
                raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> Manifest:
        for field, names in (("models", [m.name for m in self.models]), ("targets", [t.name for t in self.targets])):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                msg = f"{field}: duplicate names: {', '.join(dupes)}"
                raise ValueError(msg)
        names = [s.name for s in self.perf]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            msg = f"perf: duplicate scenario names: {', '.join(dupes)}"
            raise ValueError(msg)
        targets = {t.name: t for t in self.targets}
        for i, scenario in enumerate(self.perf):
            if scenario.prompt_set is not None and scenario.prompt_set not in self.prompts:
                msg = f"perf[{i}].prompt_set: no prompt set {scenario.prompt_set!r}; sets: {', '.join(self.prompts)}"
                raise ValueError(msg)
            if scenario.parity is not None and scenario.parity.prompt_set not in self.prompts:
                msg = f"perf[{i}].parity.prompt_set: no prompt set {scenario.parity.prompt_set!r}; "
                raise ValueError(msg + f"sets: {', '.join(self.prompts)}")
            for name in scenario.targets or ():
                if name not in targets or not targets[name].can("perf"):
                    msg = f"perf[{i}].targets: {name!r} is not a target of a kind that runs perf scenarios"
                    raise ValueError(msg)
            if scenario.clients > 1:  # the client actors reach the target over HTTP
                names = scenario.targets or [t.name for t in self.targets if t.can("perf")]
                if local := [n for n in names if targets[n].kind not in REMOTE_KINDS]:
                    msg = (
                        f"perf[{i}].clients: {scenario.clients} client processes need targets they can reach over "
                        f"HTTP ({', '.join(REMOTE_KINDS)}); {', '.join(map(repr, local))} serve(s) in-process: "
                        "name the scenario's targets, or set clients: 1"
                    )
                    raise ValueError(msg)
        if self.reference in targets and not targets[self.reference].parity:
            msg = f"reference {self.reference!r} has parity: false; the reference must run the parity prompts"
            raise ValueError(msg)
        self._check_probes(targets)
        self._check_drilldown(targets)
        self._check_after()
        for i, gate in enumerate(self.gates):
            for field, known in (
                ("models", {m.name for m in self.models}),
                ("targets", {t.name for t in self.targets}),
            ):
                unknown = sorted(set(getattr(gate, field) or ()) - known)
                if unknown:
                    msg = f"gates[{i}].{field}: {', '.join(unknown)} not in the manifest's {field}"
                    raise ValueError(msg)
        if self.reference not in {t.name for t in self.targets}:
            msg = (
                f"reference {self.reference!r} names no target; targets are: {', '.join(t.name for t in self.targets)}"
            )
            raise ValueError(msg)
        return self

    def _check_after(self) -> None:
        """`after:` names an earlier candidate: the reference runs until every candidate is scored, so
        waiting on it (or on a later target) could never end."""
        earlier: set[str] = set()
        for i, target in enumerate(self.targets):
            if target.after is not None and target.after not in earlier - {self.reference}:
                why = "the reference" if target.after == self.reference else "not an earlier target"
                msg = f"targets[{i}].after: {target.after!r} is {why}; after: names an earlier candidate target"
                raise ValueError(msg)
            earlier.add(target.name)

    def _check_probes(self, targets: dict[str, TargetArgs]) -> None:
        for kind in PROBE_KINDS:
            probe = getattr(self.probes, kind)
            if probe is None:
                continue
            where, capability = f"probes.{kind}", probe_capability(kind)
            if probe.prompt_set not in self.prompts:
                msg = f"{where}.prompt_set: no prompt set {probe.prompt_set!r}; sets: {', '.join(self.prompts)}"
                raise ValueError(msg)
            able = ", ".join(k for k, b in BACKENDS.items() if capability in b.args.capabilities)
            ref = targets.get(self.reference)
            if ref is None:
                continue  # reported by the reference check
            if not ref.can(capability):
                msg = f"{where}: the reference {self.reference!r} is a {ref.kind!r} target; "
                msg += f"this probe runs on {able} targets"
                raise ValueError(msg)
            for name in probe.targets or ():
                if name not in targets or not targets[name].can(capability):
                    msg = f"{where}.targets: {name!r} is not a target that can run it ({able})"
                    raise ValueError(msg)

    def _check_drilldown(self, targets: dict[str, TargetArgs]) -> None:
        if self.drilldown is None or self.reference not in targets:
            return
        ref = targets[self.reference]
        if not ref.can("probe_layers"):
            msg = f"drilldown: the reference {self.reference!r} is a {ref.kind!r} target; the drill-down reads "
            msg += "hidden states from the reference and its precision twin: make an hf target the reference"
            raise ValueError(msg)
        for name in self.drilldown.targets or ():
            if name not in targets or not targets[name].can("probe_layers") or name == self.reference:
                msg = f"drilldown.targets: {name!r} is not a candidate that gives hidden states (an hf target)"
                raise ValueError(msg)

    def drilled(self) -> list[str]:
        """The candidates probed at every divergence's prefix (besides the reference and its twin)."""
        if self.drilldown is None:
            return []
        able = [t.name for t in self.targets if t.can("probe_layers") and t.name != self.reference]
        return [n for n in able if self.drilldown.targets is None or n in self.drilldown.targets]

    def probed(self, kind: ProbeKind) -> list[str]:
        """Targets the `kind` probe runs on: those named (plus the reference), else all able ones."""
        probe = getattr(self.probes, kind)
        if probe is None:
            return []
        able = [t.name for t in self.targets if t.can(probe_capability(kind))]
        named = set(probe.targets or able) | {self.reference}
        return [n for n in able if n in named]

    def prompt_list(self, name: str) -> list[Prompt]:
        """Every prompt of a set, read whole: for probes and perf scenarios, which take a set in one call."""
        prompt_set = self.prompts[name]
        if isinstance(prompt_set, PromptFile):
            return [p for piece in chunks(prompt_set, CHECK_ROWS) for p in read_slice(piece)]
        return prompt_set

    def target(self, name: str) -> TargetArgs:
        return next(t for t in self.targets if t.name == name)

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)
