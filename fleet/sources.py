"""Model sources: where a model's weights come from, and turning that into a local directory.

Resolution runs on the node that hosts the actor (each node has its own disk), so every
resolver must be deterministic: the same spec gives the same bytes on every node.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from actors.base import Strict


def cache_root() -> Path:
    """Where fleet-eval keeps models it builds or converts ($FLEET_CACHE, else ~/.cache/fleet-eval)."""
    return Path(os.environ.get("FLEET_CACHE") or Path.home() / ".cache" / "fleet-eval")


class PathSource(Strict):
    """A local HF-format model directory (config.json, weights, tokenizer)."""

    kind: Literal["path"] = "path"
    path: Path = Field(description="Directory; relative paths are relative to the manifest file.")

    def local_dir(self) -> Path:
        return self.path


class SyntheticSource(Strict):
    """A tiny randomly initialised model, built locally from a seed; identical on every node."""

    kind: Literal["synthetic"] = "synthetic"
    family: Literal["llama", "qwen2"] = Field("llama", description="Architecture family.")
    seed: int = Field(0, description="Seed for the weights.")
    hidden_size: int = Field(128, ge=8, description="Model width.")
    intermediate_size: int = Field(256, ge=8, description="MLP width.")
    num_layers: int = Field(2, ge=1, description="Decoder layers.")
    num_heads: int = Field(4, ge=1, description="Attention heads.")
    num_kv_heads: int = Field(2, ge=1, description="Key/value heads (GQA when fewer than heads).")
    vocab_size: int = Field(512, ge=300, le=8192, description="Tokenizer vocabulary, trained locally.")
    max_position_embeddings: int = Field(512, ge=64, description="Longest sequence.")
    init_std: float = Field(0.02, gt=0, description="Std of the normal weight init (peakier logits when larger).")

    def digest(self) -> str:
        """Content key of the model this spec builds (also the cache directory name)."""
        from fleet.synthetic import FORMAT

        return hashlib.sha256(f"{FORMAT}:{self.model_dump_json()}".encode()).hexdigest()[:16]

    def local_dir(self) -> Path:
        """Build (once, under a lock) into the cache and return the directory."""
        from fleet.synthetic import build

        return build(self, cache_root() / "synthetic" / self.digest())


ModelSource = Annotated[PathSource | SyntheticSource, Field(discriminator="kind")]


def weights_digest(model_dir: Path) -> str:
    """sha256 over the weight files' names and bytes: tells two 'same name' models apart."""
    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin")):
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]
