"""Backends, one module each, registered here under their manifest `kind`.

A backend is an args model (validated in the manifest, picklable, cheap to import) plus an
engine class. Engine classes are named by "module:Class" strings and imported only inside the
Ray actor that owns the card, so the driver never imports torch, vllm or transformers.
"""

from __future__ import annotations

import importlib

from actors.base import Backend, Engine, TargetArgs
from actors.endpoint import EndpointArgs
from actors.hf_reference import HFArgs
from actors.test_double import TestDoubleArgs
from actors.vllm_engine import VllmArgs
from actors.vllm_server import VllmServerArgs

BACKENDS: dict[str, Backend] = {
    "vllm": Backend(VllmArgs, "actors.vllm_engine:VllmEngine"),
    "hf": Backend(HFArgs, "actors.hf_reference:HFEngine"),
    "vllm-server": Backend(VllmServerArgs, "actors.vllm_server:VllmServerEngine"),
    "endpoint": Backend(EndpointArgs, "actors.endpoint:EndpointEngine"),
    "test-double": Backend(TestDoubleArgs, "actors.test_double:TestDoubleEngine"),
}


def engine_class(kind: str) -> type[Engine]:
    """Import the engine class for `kind`; call only where the engine will run."""
    if kind not in BACKENDS:
        msg = f"unknown backend kind {kind!r}; known kinds: {', '.join(sorted(BACKENDS))}"
        raise KeyError(msg)
    module, _, name = BACKENDS[kind].engine.partition(":")
    cls: type[Engine] = getattr(importlib.import_module(module), name)
    return cls


__all__ = ["BACKENDS", "Backend", "Engine", "TargetArgs", "engine_class"]
