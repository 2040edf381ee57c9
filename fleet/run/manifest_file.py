"""Reading a manifest file into a `Manifest` (fleet/run/manifest.py): the file's YAML, then any
`--set KEY=VALUE` overrides, validated; then what the models alone cannot check: model paths
relative to the file, probed targets built for full-vocabulary probes, and every context
(fleet/run/context.py).

Every bad input becomes a ManifestError naming the file, the field path and what was expected,
so the CLI can print one line and exit 2 without a traceback and without writing results.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from fleet.contracts.errors import ManifestError, UserError
from fleet.contracts.inputs import clip, cut, load_yaml, read_text
from fleet.contracts.messages import error_line, relevant
from fleet.contracts.sources import GgufSource, PathSource
from fleet.contracts.spec import PROBE_KINDS
from fleet.run.context import check_context
from fleet.run.manifest import Manifest


def load(path: str | Path, *, overrides: Sequence[str] = ()) -> Manifest:
    """Read and validate a manifest file; relative paths inside it are relative to the file.
    `overrides` are `KEY=VALUE` settings applied to the file's YAML first (see `override`)."""
    path = Path(path)
    try:
        raw = load_yaml(read_text(path, what="manifest"), source=str(path))
    except UserError as e:
        raise ManifestError(str(e)) from None
    if not isinstance(raw, dict):
        msg = f"{path}: expected a mapping with models, prompts, targets, reference"
        raise ManifestError(msg)
    for setting in overrides:
        raw = override(raw, setting, where=path)
    base_dir = path.resolve().parent
    try:
        manifest = TypeAdapter(Manifest).validate_python(raw, context={"base_dir": base_dir})
    except ValidationError as e:
        raise ManifestError(format_error(path, raw, e)) from None
    manifest = _full_vocab_for_probes(_resolve_paths(manifest, base_dir, path))
    check_context(manifest.models, manifest.targets, manifest.sampling.max_tokens, manifest.perf, path)
    return manifest


def override(raw: dict[str, Any], setting: str, *, where: Path) -> dict[str, Any]:
    """`raw` with one `KEY=VALUE` applied: KEY a dotted path (list items by index, e.g.
    `perf.0.num_requests`), VALUE parsed as YAML (`[1, 8]`, `{kind: synthetic}`, `null`). The file
    first, then the command line: a manifest's test-size run is the same file with sizes cut."""
    key, sep, text = setting.partition("=")
    if not sep or not key:
        msg = f"--set {clip(setting)}: expected KEY=VALUE, e.g. sampling.max_tokens=4"
        raise ManifestError(msg)
    shown = cut(key, 80)  # for messages: a key of any length is still navigated whole
    try:  # the manifest's own loader: duplicate keys, alias bombs and bad scalars refused alike
        value = load_yaml(text, source=f"--set {shown}")
    except UserError as e:
        raise ManifestError(str(e)) from None
    out = copy.deepcopy(raw)
    node: Any = out
    parts = key.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        here = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                msg = f"{where}: --set {shown}: {here} is not an item of a list of {len(node)}"
                raise ManifestError(msg)
            index: int | str = int(part)
        elif isinstance(node, dict):
            index = part
            if not last:
                node = node.setdefault(part, {})
                continue
        else:
            msg = f"{where}: --set {shown}: {'.'.join(parts[:depth])} is neither a mapping nor a list"
            raise ManifestError(msg)
        if last:
            node[index] = value
        else:
            node = node[index]
    return out


def _full_vocab_for_probes(manifest: Manifest) -> Manifest:
    """Each probed target as its backend builds it for those probes (vLLM: max_logprobs=-1)."""
    probes = {t: {k for k in PROBE_KINDS if t in manifest.probed(k)} for t in (t.name for t in manifest.targets)}
    targets = [t.for_probes(probes[t.name]) if probes[t.name] else t for t in manifest.targets]
    return manifest.model_copy(update={"targets": targets})


def _resolve_paths(manifest: Manifest, base_dir: Path, path: Path) -> Manifest:
    """Make local model paths absolute (relative to the manifest file) and check path sources."""
    models = []
    for i, model in enumerate(manifest.models):
        source = model.source
        if isinstance(source, PathSource | GgufSource) and source.path is not None:
            source = source.model_copy(update={"path": (base_dir / source.path).resolve()})
        if isinstance(source, PathSource) and not (source.path / "config.json").is_file():
            msg = f"{path}: models[{i}].source.path: {source.path} is not a model directory (no config.json)"
            raise ManifestError(msg)
        models.append(model.model_copy(update={"source": source}))
    return manifest.model_copy(update={"models": models})


# Fields whose value may be a credential: a message names the field and the rule, never the value.
_SECRET_FIELDS = {"base_url", "env", "api_key_env"}
SHOWN_ERRORS = 2  # with the header line, a message is at most 3 lines


def format_error(path: str | Path, raw: Any, error: ValidationError) -> str:
    """At most 3 lines: how many errors, then the first two, each naming the field as written."""
    errors = relevant(error.errors(include_url=False))
    more = f" (the first {SHOWN_ERRORS} shown)" if len(errors) > SHOWN_ERRORS else ""
    lines = [f"{cut(str(path), 200)}: {len(errors)} error(s){more}"]
    lines += [
        cut(f"  {error_line(err, raw, hidden=_SECRET_FIELDS, model=Manifest)}", 300) for err in errors[:SHOWN_ERRORS]
    ]
    return "\n".join(lines)
