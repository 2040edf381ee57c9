"""The backend registry: each `kind` is an args model plus an engine class.

Engine classes are named by "module:Class" strings and imported only inside the Ray actor that
owns the card, so the driver never imports torch, vllm or transformers. Adding a backend: an
engine module in actors/, its args model in fleet/contracts/backend_args.py, and one line in
BACKENDS.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet.contracts.backend_args import EndpointArgs, HFArgs, TestDoubleArgs, VllmArgs, VllmServerArgs
from fleet.contracts.targets import TargetArgs


@dataclass(frozen=True)
class Backend:
    """A registry entry: the args model and the engine class as a "module:Class" string."""

    args: type[TargetArgs]
    engine: str


BACKENDS: dict[str, Backend] = {
    "vllm": Backend(VllmArgs, "actors.vllm_engine:VllmEngine"),
    "hf": Backend(HFArgs, "actors.hf_reference:HFEngine"),
    "vllm-server": Backend(VllmServerArgs, "actors.vllm_server:VllmServerEngine"),
    "endpoint": Backend(EndpointArgs, "actors.endpoint:EndpointEngine"),
    "test-double": Backend(TestDoubleArgs, "actors.test_double:TestDoubleEngine"),
}

# The engine side, as the driver names it: it never imports actors/ directly (the import checker
# enforces that), so the actor class and the source preflight are looked up by string.
TARGET_ACTOR = "actors.target_actor:TargetActor"
SOURCE_PREFLIGHT = "actors.sources:preflight"


def engine_side(ref: str) -> Callable[..., Any]:
    """Import an engine-side object named "module:attribute"."""
    module, _, name = ref.partition(":")
    obj: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return obj
