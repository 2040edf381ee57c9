"""The engine side: everything that runs inside the Ray actor that owns a card.

It imports fleet.contracts only, never the driver. Engine classes are registered in
fleet/contracts/backends.py by "module:Class" string and imported here, inside the actor.
"""

from __future__ import annotations

import importlib

from fleet.contracts.backends import BACKENDS
from fleet.contracts.engine import Engine


def engine_class(kind: str) -> type[Engine]:
    """Import the engine class for `kind`; call only where the engine will run."""
    if kind not in BACKENDS:
        msg = f"unknown backend kind {kind!r}; known kinds: {', '.join(sorted(BACKENDS))}"
        raise KeyError(msg)
    module, _, name = BACKENDS[kind].engine.partition(":")
    cls: type[Engine] = getattr(importlib.import_module(module), name)
    return cls
