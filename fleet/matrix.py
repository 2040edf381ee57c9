"""The feature matrix: a target expanded into one variant per combination of settings, and greedy
self-consistency between the variants of one base target (graph vs eager must give identical
tokens, as vllm-ascend's own CI checks).

A target spec's `matrix:` maps a field to the values to try; a dotted key sets a nested field:

    - name: vllm-npu
      kind: vllm
      device: npu
      matrix: {enforce_eager: [true, false], engine_args.enable_chunked_prefill: [true, false]}

gives vllm-npu.enforce_eager-true.enable_chunked_prefill-true, ... (4 targets, last key fastest).
Pure Python and Polars: the manifest expands before validating each variant as a target.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from fleet.analysis import Frame

_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class Expansion:
    """Targets with every matrix expanded, and for each variant its base target and settings."""

    targets: list[dict[str, Any]]
    variants_of: dict[str, str]  # variant name -> base target name
    settings: dict[str, dict[str, Any]]  # variant name -> {matrix key: value}


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
            parts.append(f"{key.rsplit('.', 1)[-1]}-{_label(value)}")
        variant["name"] = ".".join(parts)
        variants.append(variant)
    names = [v["name"] for v in variants]
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        msg = f"target {name!r}: matrix gives duplicate variant names: {', '.join(dupes)}"
        raise ValueError(msg)
    return variants


def expand_targets(targets: list[Mapping[str, Any]]) -> Expansion:
    """Every target of a manifest, those with a `matrix:` replaced by their variants, in order."""
    out: list[dict[str, Any]] = []
    variants_of: dict[str, str] = {}
    settings: dict[str, dict[str, Any]] = {}
    for target in targets:
        if "matrix" not in target:
            out.append(dict(target))
            continue
        matrix = target["matrix"]
        for variant, combo in zip(expand(target, matrix), itertools.product(*matrix.values()), strict=True):
            out.append(variant)
            variants_of[variant["name"]] = target["name"]
            settings[variant["name"]] = dict(zip(matrix, combo, strict=True))
    return Expansion(out, variants_of, settings)


def self_consistency(
    requests: Frame,
    variants_of: Mapping[str, str],
    *,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
) -> pl.DataFrame:
    """Greedy output token ids compared between variants of the same base target, per model.

    Every pair of variants of one base is compared; with `settings` (Expansion.settings) only
    pairs that differ in exactly one matrix key, named in `differs_in` ("enforce_eager: true vs
    false"), since variants of different dtypes are not expected to agree.
    Output: model, base, target_a, target_b, differs_in, n_prompts (prompts both answered),
    n_identical, identical (every compared prompt identical, and at least one compared),
    first_diff_prompt ("prompt_set/prompt_id", the first differing in that order),
    first_diff_position (0-based output position where that prompt's outputs part).
    """
    pairs = _pairs(variants_of, settings)
    ids = pl.coalesce("output_token_ids", pl.lit([], dtype=pl.List(pl.Int32)))
    outputs = requests.lazy().select("model", "target", "prompt_set", "prompt_id", _ids=ids)
    on = ["model", "prompt_set", "prompt_id"]
    compared = (
        pairs.lazy()
        .join(outputs.rename({"target": "target_a", "_ids": "_a"}), on="target_a", how="inner")
        .join(outputs.rename({"target": "target_b", "_ids": "_b"}), on=[*on, "target_b"], how="inner")
        .with_columns(same=pl.col("_a") == pl.col("_b"))
        .sort("model", "target_a", "target_b", "prompt_set", "prompt_id")
        .collect()
    )
    keys = ["model", "base", "target_a", "target_b", "differs_in"]
    first_diff = (
        compared.filter(~pl.col("same"))
        .group_by(keys, maintain_order=True)
        .first()
        .select(
            *keys,
            first_diff_prompt=pl.concat_str("prompt_set", pl.lit("/"), "prompt_id"),
            first_diff_position=pl.struct("_a", "_b").map_elements(_first_difference, return_dtype=pl.Int64),
        )
    )
    return (
        compared.group_by(keys)
        .agg(n_prompts=pl.len(), n_identical=pl.col("same").sum())
        .with_columns(identical=(pl.col("n_identical") == pl.col("n_prompts")) & (pl.col("n_prompts") > 0))
        .join(first_diff, on=keys, how="left", nulls_equal=True)
        .sort("model", "base", "target_a", "target_b")
    )


def _pairs(variants_of: Mapping[str, str], settings: Mapping[str, Mapping[str, Any]] | None) -> pl.DataFrame:
    rows = []
    by_base: dict[str, list[str]] = {}
    for variant, base in variants_of.items():
        by_base.setdefault(base, []).append(variant)
    for base, variants in by_base.items():
        for a, b in itertools.combinations(variants, 2):
            differs_in = None
            if settings is not None:
                sa, sb = settings.get(a, {}), settings.get(b, {})
                changed = [k for k in {**sa, **sb} if sa.get(k) != sb.get(k)]
                if len(changed) != 1:
                    continue
                [key] = changed
                differs_in = f"{key}: {_label(sa.get(key))} vs {_label(sb.get(key))}"
            rows.append({"base": base, "target_a": a, "target_b": b, "differs_in": differs_in})
    schema = {"base": pl.String, "target_a": pl.String, "target_b": pl.String, "differs_in": pl.String}
    return pl.DataFrame(rows, schema=schema)


def _first_difference(pair: dict[str, list[int]]) -> int:
    a, b = pair["_a"], pair["_b"]
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _check(base: Mapping[str, Any], matrix: Mapping[str, list[Any]]) -> None:
    name = base["name"]
    if not isinstance(matrix, Mapping) or not matrix:
        msg = f"target {name!r}: matrix must map fields to lists of values"
        raise ValueError(msg)
    for key, values in matrix.items():
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


def _label(value: Any) -> str:
    # bool before anything else: True == 1, so a lookup table would name tensor_parallel_size 1 "true".
    text = ("true" if value else "false") if isinstance(value, bool) else "null" if value is None else str(value)
    return _NOT_NAME.sub("_", text)
