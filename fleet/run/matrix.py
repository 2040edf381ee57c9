"""The feature matrix: a target expanded into one variant per combination of settings (greedy
self-consistency between the variants is fleet/analysis/consistency.py).

A target spec's `matrix:` maps a field to the values to try; a dotted key sets a nested field:

    - name: vllm-npu
      kind: vllm
      device: npu
      matrix: {enforce_eager: [true, false], engine_args.enable_chunked_prefill: [true, false]}

gives vllm-npu.enforce_eager-true.enable_chunked_prefill-true, ... (4 targets, last key fastest).
Pure Python: the manifest expands before validating each variant as a target.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.contracts.spec import setting_label


@dataclass(frozen=True)
class Expansion:
    """Targets with every matrix expanded, and for each variant its base target and settings."""

    targets: list[dict[str, Any]]
    variants_of: dict[str, str]  # variant name -> base target name
    settings: dict[str, dict[str, Any]]  # variant name -> {matrix key: value}
    repeats: dict[str, str]  # copy name -> the target it repeats (`repeat: N`)


MAX_REPEAT = 8


def expand(target: Mapping[str, Any], matrix: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """One target dict per combination of the matrix values, named `<name>.<key>-<value>...`.

    The key in a name is the last part of a dotted key; values are written as YAML would
    (true/false/null), characters outside letters, digits and `. _ -` become `_`. A `matrix`
    entry in `target` itself is dropped from the variants.
    """
    base = {k: v for k, v in target.items() if k != "matrix"}
    name = base.get("name")
    if not isinstance(name, str) or not name:
        msg = "a target with a matrix needs a name"
        raise ValueError(msg)
    _check(base, matrix)
    variants = []
    for combo in itertools.product(*matrix.values()):
        variant = copy.deepcopy(base)
        parts = [name]
        for key, value in zip(matrix, combo, strict=True):
            _set(variant, key, value)
            parts.append(f"{key.rsplit('.', 1)[-1]}-{setting_label(value)}")
        variant["name"] = ".".join(parts)
        variants.append(variant)
    names = [v["name"] for v in variants]
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        msg = f"target {name!r}: matrix gives duplicate variant names: {', '.join(dupes)}"
        raise ValueError(msg)
    return variants


def expand_targets(targets: list[Mapping[str, Any]]) -> Expansion:
    """Every target of a manifest, those with a `matrix:` replaced by their variants, and those
    with `repeat: N` followed by N - 1 copies named `<name>.repeat-<i>`, in order. A copy runs in
    an actor of its own, so it measures the target against itself: its noise floor."""
    out: list[dict[str, Any]] = []
    variants_of: dict[str, str] = {}
    settings: dict[str, dict[str, Any]] = {}
    repeats: dict[str, str] = {}
    for target in targets:
        base = {k: v for k, v in target.items() if k != "repeat"}
        times = _repeat(target)
        expanded = [base]
        if "matrix" in base:
            matrix = base["matrix"]
            expanded = expand(base, matrix)
            for variant, combo in zip(expanded, itertools.product(*matrix.values()), strict=True):
                variants_of[variant["name"]] = base["name"]
                settings[variant["name"]] = dict(zip(matrix, combo, strict=True))
        for one in expanded:
            out.append(dict(one))
            for i in range(2, times + 1):
                copy_name = f"{one['name']}.repeat-{i}"
                out.append(dict(one) | {"name": copy_name})
                repeats[copy_name] = one["name"]
    return Expansion(out, variants_of, settings, repeats)


def _repeat(target: Mapping[str, Any]) -> int:
    times = target.get("repeat", 1)
    if isinstance(times, bool) or not isinstance(times, int) or not 1 <= times <= MAX_REPEAT:
        msg = f"target {target.get('name')!r}: repeat must be an integer from 1 to {MAX_REPEAT} (got {times!r})"
        raise ValueError(msg)
    if times > 1 and not isinstance(target.get("name"), str):
        msg = "a target with repeat needs a name"
        raise ValueError(msg)
    return times


def _check(base: Mapping[str, Any], matrix: Mapping[str, list[Any]]) -> None:
    name = base["name"]
    if not isinstance(matrix, Mapping) or not matrix:
        msg = f"target {name!r}: matrix must map fields to lists of values"
        raise ValueError(msg)
    for key, values in matrix.items():
        if not isinstance(key, str):
            msg = f"target {name!r}: matrix keys must be field names (strings), got {str(key)[:60]!r}"
            raise ValueError(msg)
        if not isinstance(values, list) or not values:
            msg = f"target {name!r}: matrix.{key} must be a non-empty list of values"
            raise ValueError(msg)
        parts = str(key).split(".")
        if not all(parts) or parts[0] == "name":
            msg = f"target {name!r}: matrix key {key!r} names no field (and 'name' cannot vary)"
            raise ValueError(msg)
        node: Any = base
        for part in parts[:-1]:
            node = node.get(part, {}) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            msg = f"target {name!r}: matrix key {key!r}: {'.'.join(parts[:-1])} is not a mapping"
            raise ValueError(msg)
        if parts[-1] in node:
            msg = f"target {name!r}: {key} is set both in the target and in its matrix"
            raise ValueError(msg)


def _set(target: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = target
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
