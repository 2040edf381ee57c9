"""The backend registry keeps its promises: each `kind` names its args model and an engine class
that imports, every capability an args model declares is implemented by its engine with the
capability Protocol's signature, and nothing calls a capability a backend does not declare.

The engine modules are imported (vllm itself only inside their methods); no engine is started.
"""

from __future__ import annotations

import inspect
import textwrap
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

from actors import engine_class
from actors.target_actor import TargetActor
from fleet.contracts.backends import BACKENDS, SOURCE_PREFLIGHT, TARGET_ACTOR, engine_side
from fleet.contracts.engine import CAPABILITY_PROTOCOLS, Engine
from fleet.contracts.targets import CAPABILITIES, Capability, TargetArgs
from fleet.run.manifest_file import load
from fleet.run.plan import plan_perf, plan_probes


def _parameters(method: Any) -> list[tuple[str, Any]]:
    """A method's parameters as (name, kind), without self: defaults and annotations may differ."""
    return [(p.name, p.kind) for p in _own_parameters(method)]


def _own_parameters(method: Any) -> list[inspect.Parameter]:
    """The method's own parameters: `ray.remote` adds `_ray_trace_ctx` to an actor class's methods
    in place, so once any test in this process has started the actor, that keyword is there too."""
    return [p for p in inspect.signature(method).parameters.values() if p.name not in ("self", "_ray_trace_ctx")]


def capability_errors(args: type[TargetArgs], engine: type) -> list[str]:
    """What is wrong between the capabilities `args` declares and what `engine` implements."""
    errors = []
    for capability in CAPABILITIES:
        protocol = CAPABILITY_PROTOCOLS[capability]
        declared, implemented = capability in args.capabilities, issubclass(engine, protocol)
        name = f"{engine.__name__} ({args.__name__})"
        if declared and not implemented:
            errors.append(f"{name} declares {capability!r} but does not implement {protocol.__name__}")
        elif implemented and not declared:
            # Nothing would ever call it (the scheduler and the actor ask the declaration): dead
            # code, or a declaration forgotten.
            errors.append(f"{name} implements {protocol.__name__} but does not declare {capability!r}")
        elif declared:
            for method in _protocol_methods(protocol):
                want, have = _parameters(getattr(protocol, method)), _parameters(getattr(engine, method))
                if want != have:
                    errors.append(f"{name}.{method} takes {have}; {protocol.__name__} says {want}")
    return errors


def _protocol_methods(protocol: type) -> list[str]:
    return sorted(n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_"))


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_declared_capabilities_are_implemented(kind: str) -> None:
    assert capability_errors(BACKENDS[kind].args, engine_class(kind)) == []


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_kind_literal_is_the_registry_key_and_the_engine_resolves(kind: str) -> None:
    args = BACKENDS[kind].args
    assert typing.get_args(args.model_fields["kind"].annotation) == (kind,)
    assert args.model_fields["kind"].default == kind
    engine = engine_class(kind)
    assert BACKENDS[kind].engine == f"{engine.__module__}:{engine.__qualname__}"
    assert issubclass(engine, Engine) and not inspect.isabstract(engine)


def test_engine_side_names_resolve() -> None:
    assert engine_side(TARGET_ACTOR) is TargetActor
    assert callable(engine_side(SOURCE_PREFLIGHT))
    with pytest.raises(KeyError, match="known kinds: endpoint, hf"):
        engine_class("no-such-backend")


def test_each_capability_is_one_method_of_the_same_name_on_the_actor() -> None:
    """The scheduler calls a capability as the actor method of that name (fleet/run/work.py)."""
    for capability, protocol in CAPABILITY_PROTOCOLS.items():
        assert _protocol_methods(protocol) == [capability]
        assert _parameters(getattr(TargetActor, capability)) == _parameters(getattr(protocol, capability))
    assert set(CAPABILITY_PROTOCOLS) == set(CAPABILITIES)


class _BrokenArgs(TargetArgs):
    capabilities: ClassVar[frozenset[Capability]] = frozenset({"perf"})
    kind: Literal["broken"] = "broken"


class _Basics(Engine):
    def generate(self, shard: Any) -> Any: ...
    def score(self, requests: Any, *, k: int, twin: str | None = None) -> Any: ...
    def describe(self) -> dict[str, str]: ...
    def shutdown(self) -> None: ...


class _NoPerf(_Basics):
    """Declares perf (in _BrokenArgs) and has no perf method."""


class _WrongPerf(_Basics):
    def perf(self, scenario: Any, concurrency: int, prompts: Any) -> Any: ...


class _UndeclaredSmoke(_Basics):
    def perf(self, scenario: Any, level: int, prompts: Any = None, parity_prompts: Any = None) -> Any: ...
    def smoke(self) -> Any: ...


def test_a_broken_backend_is_caught() -> None:
    assert capability_errors(_BrokenArgs, _NoPerf) == [
        "_NoPerf (_BrokenArgs) declares 'perf' but does not implement RunsPerf"
    ]
    [wrong] = capability_errors(_BrokenArgs, _WrongPerf)
    assert "_WrongPerf (_BrokenArgs).perf takes" in wrong and "'concurrency'" in wrong
    assert capability_errors(_BrokenArgs, _UndeclaredSmoke) == [
        "_UndeclaredSmoke (_BrokenArgs) implements Smokes but does not declare 'smoke'"
    ]


class _Everything:
    """An engine with every capability, to show the actor calls only the declared ones."""

    def perf(self, scenario: Any, level: int, prompts: Any, parity_prompts: Any = None) -> str:
        return "perf"

    def smoke(self) -> str:
        return "smoke"

    def probe_logits(self, prompts: Any, *, prompt_set: str, positions: Any) -> str:
        return "probe_logits"

    def probe_layers(
        self, prompts: Any, *, prompt_set: str, positions: Any, sublayers: bool = False, twin: Any = None
    ) -> str:
        return "probe_layers"


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_the_actor_refuses_an_undeclared_capability(kind: str) -> None:
    actor = TargetActor.__new__(TargetActor)  # no model, no engine start: just its dispatch
    actor.target = BACKENDS[kind].args.model_construct(name="t")
    actor.engine = _Everything()
    for capability in CAPABILITIES:
        call = getattr(actor, capability)
        args = _own_parameters(call)
        positional = [None for p in args if p.kind is p.POSITIONAL_OR_KEYWORD]
        keywords = {p.name: None for p in args if p.kind is p.KEYWORD_ONLY}
        if capability in BACKENDS[kind].args.capabilities:
            assert call(*positional, **keywords) == capability
        else:
            with pytest.raises(TypeError, match=f"do not declare the {capability!r} capability"):
                call(*positional, **keywords)


def test_planning_asks_only_for_declared_capabilities(tmp_path: Path) -> None:
    """One target of every backend, every perf scenario and probe asked for: each lands only on
    the targets that declare the capability it needs."""
    required = {"endpoint": ", base_url: 'http://127.0.0.1:9/v1'"}
    targets = "\n".join(f"  - {{name: t-{kind}, kind: {kind}{required.get(kind, '')}}}" for kind in BACKENDS)
    path = tmp_path / "m.yaml"
    path.write_text(
        textwrap.dedent(
            """
            models:
              - {name: m, source: {kind: synthetic, seed: 1}}
            prompts:
              p: [{id: a, prompt: "one"}]
            reference: t-hf
            perf:
              - {name: s, concurrency: [1], input_tokens: 4, output_tokens: 2, num_requests: 2}
            probes:
              logits: {prompt_set: p}
              layers: {prompt_set: p}
            targets:
            """
        )
        + targets
    )
    manifest = load(path)

    def declaring(capability: Capability) -> set[str]:
        return {f"t-{kind}" for kind, b in BACKENDS.items() if capability in b.args.capabilities}

    assert {p.target for p in plan_perf(manifest)} == declaring("perf")
    probes = plan_probes(manifest)
    assert {p.target for p in probes if p.kind == "logits"} == declaring("probe_logits")
    assert {p.target for p in probes if p.kind == "layers"} == declaring("probe_layers")
