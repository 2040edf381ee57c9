"""Greedy self-consistency between the variants of one matrix target: graph vs eager, chunked
prefill on vs off must give identical tokens (as vllm-ascend's own CI checks)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import polars as pl

from fleet.analysis.parity import Frame
from fleet.contracts.spec import setting_label


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
                differs_in = f"{key}: {setting_label(sa.get(key))} vs {setting_label(sb.get(key))}"
            rows.append({"base": base, "target_a": a, "target_b": b, "differs_in": differs_in})
    schema = {"base": pl.String, "target_a": pl.String, "target_b": pl.String, "differs_in": pl.String}
    return pl.DataFrame(rows, schema=schema)


def _first_difference(pair: dict[str, list[int]]) -> int:
    a, b = pair["_a"], pair["_b"]
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
