"""Requests that cannot fit a model's context, found before anything starts.

A target runs a model with a context known before start when the model or the target sets
`max_model_len`, or the model's own is readable here (a synthetic spec, a local config.json).
What only the engine's tokenizer knows (a prompt's length in tokens) fails in the engine instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.contracts.errors import ManifestError
from fleet.contracts.inputs import cut
from fleet.contracts.sources import PathSource, SyntheticSource

if TYPE_CHECKING:
    from fleet.contracts.scenario import Scenario
    from fleet.contracts.spec import ModelSpec
    from fleet.contracts.targets import TargetArgs


def context_length(model: ModelSpec, target: TargetArgs) -> int | None:
    """The context a target runs `model` with, where it is known before anything starts: the model's
    or target's max_model_len, else the model's own (a synthetic spec, a local config.json)."""
    own: int | None = None
    if isinstance(model.source, SyntheticSource):
        own = model.source.max_position_embeddings
    elif isinstance(model.source, PathSource):
        own = _config_context(model.source.path)
    if target.kind == "endpoint":  # its server decides, and says so only when asked
        return model.max_model_len
    return model.max_model_len or getattr(target, "max_model_len", None) or own


def _config_context(model_dir: Path) -> int | None:
    try:
        value = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable here: the engine will say why
    return value if isinstance(value, int) and value > 0 else None


def check_context(
    models: Sequence[ModelSpec],
    targets: Sequence[TargetArgs],
    max_tokens: int,
    perf: Sequence[Scenario],
    path: str | Path,
) -> None:
    """Requests that cannot fit a known context fail here, not as an engine error after start:
    `max_tokens` (sampling's) plus at least one prompt token for parity, input + output tokens for
    perf. Takes the manifest's parts, not the Manifest: manifest.py calls this while loading."""
    for model in models:
        for target in targets:
            length = context_length(model, target)
            if length is None:
                continue
            where = f"{cut(str(path), 200)}: model {model.name!r} on target {target.name!r}"
            if target.parity and max_tokens + 1 > length:
                msg = f"{where}: sampling.max_tokens {max_tokens} plus the prompt "
                msg += f"exceeds its context of {length} tokens"
                raise ManifestError(msg)
            for scenario in perf:
                longest = scenario.longest_request
                if longest is None or (scenario.targets and target.name not in scenario.targets):
                    continue
                if target.can("perf") and longest > length:
                    msg = f"{where}: perf {scenario.name!r} needs up to {longest} tokens (prompt + output), "
                    msg += f"over its context of {length}"
                    raise ManifestError(msg)
