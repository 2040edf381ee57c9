"""Greedy self-consistency between the variants of one matrix target (graph vs eager, chunked
prefill on vs off, TP 1 vs 2), judged as parity is (fleet/analysis/divergence.py): where two
variants' greedy outputs part, the reference teacher-forced both at that common prefix; when its
margin between the two tokens is within the noise and each token is in the other variant's top-k,
the prompt is a near tie (a flip numerical noise may cause on any machine), else a real
divergence (the setting changed the answer). vllm-ascend's CI asks for identical tokens; on CPU
bfloat16 with TP 2 a reduction in another order flips near ties, which is not a bug.
"""

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
    tokens: Frame | None = None,
    noise: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Greedy output token ids compared between variants of the same base target, per model.

    Every pair of variants of one base is compared; with `settings` (Expansion.settings) only
    pairs that differ in exactly one matrix key, named in `differs_in` ("enforce_eager: true vs
    false"), since variants of different dtypes are not expected to agree.
    Output: model, base, target_a, target_b, differs_in, n_prompts (prompts both answered),
    n_identical, identical (every compared prompt identical, and at least one compared),
    first_diff_prompt ("prompt_set/prompt_id", the first differing in that order),
    first_diff_position (0-based output position where that prompt's outputs part); with `tokens`
    (the tokens table) and `noise` (model, target, noise: noise_model.summary), n_near_ties and
    real_divergences (prompts whose outputs part beyond the noise), else those two are null.
    """
    compared = prompt_pairs(requests, variants_of, settings=settings, tokens=tokens, noise=noise)
    return self_consistency_of(compared)


def self_consistency_of(compared: pl.DataFrame) -> pl.DataFrame:
    """`self_consistency` from `prompt_pairs`' rows."""
    keys = ["model", "base", "target_a", "target_b", "differs_in"]
    first_diff = (
        compared.filter(~pl.col("same"))
        .group_by(keys, maintain_order=True)
        .first()
        .select(
            *keys,
            first_diff_prompt=pl.concat_str("prompt_set", pl.lit("/"), "prompt_id"),
            first_diff_position="_at",
        )
    )
    return (
        compared.group_by(keys)
        .agg(
            n_prompts=pl.len(),
            n_identical=pl.col("same").sum(),
            n_near_ties=pl.when(pl.col("_judged").first()).then(pl.col("_near").fill_null(False).sum()),
            real_divergences=pl.when(pl.col("_judged").first()).then((~pl.col("_near")).fill_null(False).sum()),
        )
        .with_columns(identical=(pl.col("n_identical") == pl.col("n_prompts")) & (pl.col("n_prompts") > 0))
        .join(first_diff, on=keys, how="left", nulls_equal=True)
        .sort("model", "base", "target_a", "target_b")
    )


def prompt_pairs(
    requests: Frame,
    variants_of: Mapping[str, str],
    *,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    tokens: Frame | None = None,
    noise: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """`self_consistency` per prompt: model, base, target_a, target_b, differs_in, prompt_set,
    prompt_id, same (identical outputs), _at (where they part), _near (a near tie; False: a real
    divergence; null where identical or not judged) and _judged (tokens and noise were given)."""
    pairs = _pairs(variants_of, settings)
    ids = pl.coalesce("output_token_ids", pl.lit([], dtype=pl.List(pl.Int32)))
    outputs = requests.lazy().select("model", "target", "prompt_set", "prompt_id", _ids=ids)
    on = ["model", "prompt_set", "prompt_id"]
    compared = (
        pairs.lazy()
        .join(outputs.rename({"target": "target_a", "_ids": "_a"}), on="target_a", how="inner")
        .join(outputs.rename({"target": "target_b", "_ids": "_b"}), on=[*on, "target_b"], how="inner")
        .with_columns(same=pl.col("_a") == pl.col("_b"))
        .with_columns(
            _at=pl.when(~pl.col("same")).then(pl.struct("_a", "_b").map_elements(_parting, return_dtype=pl.Int64))
        )
        .sort("model", "target_a", "target_b", "prompt_set", "prompt_id")
        .collect()
    )
    return _classified(compared, tokens, noise)


def per_variant(pairs: pl.DataFrame) -> pl.DataFrame:
    """Per (model, variant): consistency_real_divergences, its real divergences summed over every
    pair it is in (the gate metric: a setting that changes answers beyond the noise)."""
    both = pl.concat([pairs.select("model", "real_divergences", target=side) for side in ("target_a", "target_b")])
    both = both.filter(pl.col("real_divergences").is_not_null())  # pairs not judged (no tokens) say nothing
    return (
        both.group_by("model", "target")
        .agg(consistency_real_divergences=pl.col("real_divergences").sum().cast(pl.Int64))
        .sort("model", "target")
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


def _parting(pair: dict[str, list[int]]) -> int:
    """The first position where two outputs differ (the shorter one's length when one is a
    prefix of the other)."""
    a, b = pair["_a"] or [], pair["_b"] or []  # polars may hand a when() branch rows it masks
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _classified(compared: pl.DataFrame, tokens: Frame | None, noise: pl.DataFrame | None) -> pl.DataFrame:
    """`compared` with _near: per differing prompt, True for a near tie, False for a real
    divergence (an output ending early included), null for identical prompts or without tokens."""
    if tokens is None or noise is None:
        return compared.with_columns(_near=pl.lit(None, dtype=pl.Boolean), _judged=pl.lit(False))
    variants = set(compared["target_a"]) | set(compared["target_b"])
    at = tokens.lazy().filter(pl.col("target").is_in(variants)).select(
        "model", "target", "prompt_set", "prompt_id", _at=pl.col("position").cast(pl.Int64), _tok="token_id",
        _ref_lp="ref_logprob",
        _topk="topk_ids",
    )  # fmt: skip
    on = ["model", "prompt_set", "prompt_id", "_at"]
    side = {s: at.rename({c: f"{c}{s}" for c in ("target", "_tok", "_ref_lp", "_topk")}) for s in ("_a", "_b")}
    threshold = noise.lazy().select("model", "target", "noise")
    both_noise = pl.max_horizontal(pl.col("noise"), pl.col("noise_b"))
    near = (
        ((pl.col("_ref_lp_a").cast(pl.Float64) - pl.col("_ref_lp_b").cast(pl.Float64)).abs() <= both_noise)
        & pl.col("_topk_a").list.contains(pl.col("_tok_b"))
        & pl.col("_topk_b").list.contains(pl.col("_tok_a"))
    )
    return (
        compared.lazy()
        .join(side["_a"], on=[*on, "target_a"], how="left")
        .join(side["_b"], on=[*on, "target_b"], how="left")
        .join(threshold.rename({"target": "target_a"}), on=["model", "target_a"], how="left")
        .join(threshold.rename({"target": "target_b", "noise": "noise_b"}), on=["model", "target_b"], how="left")
        .with_columns(_near=pl.when(~pl.col("same")).then(near.fill_null(False)), _judged=pl.lit(True))
        .collect()
    )


EFFECTS = ["model", "setting", "differs_in", "target_a", "target_b", "delta_tf_p99", "noise", "effect_x_noise"]
EFFECTS += ["delta_real_divergences", "paths_changed", "n_prompts", "effect"]


def effects(pairs: pl.DataFrame, parity: pl.DataFrame) -> pl.DataFrame:
    """What changing one setting did (issue: "which setting caused the drift"), per pair of
    variants differing in it (`pairs`: self_consistency with settings), against the noise.

    Output: model, setting (the matrix key), differs_in, target_a, target_b, delta_tf_p99 (b's TF
    p99 |dlogp| to the reference minus a's, nats), noise (the larger of the two noise models'),
    effect_x_noise (|delta_tf_p99| / noise), delta_real_divergences (b's real divergences from the
    reference minus a's), paths_changed (prompts whose greedy output parts between a and b beyond
    the noise), n_prompts, effect ("above noise" when paths change beyond the noise or the p99
    moves by more than the noise, else "within noise").
    """
    per = parity.select("model", "target", "tf_p99_abs_logprob_diff", "real_divergences", "noise")
    side = {
        s: per.rename({c: f"{c}_{s}" for c in ("target", "tf_p99_abs_logprob_diff", "real_divergences", "noise")})
        for s in ("a", "b")
    }
    delta = pl.col("tf_p99_abs_logprob_diff_b") - pl.col("tf_p99_abs_logprob_diff_a")
    noise = pl.max_horizontal("noise_a", "noise_b")
    ratio = (pl.col("delta_tf_p99").abs() / pl.col("noise")).fill_nan(None)
    above = (pl.col("paths_changed") > 0) | (pl.col("effect_x_noise") > 1)
    return (
        pairs.filter(pl.col("differs_in").is_not_null())
        .join(side["a"], on=["model", "target_a"], how="left")
        .join(side["b"], on=["model", "target_b"], how="left")
        .with_columns(
            setting=pl.col("differs_in").str.split(":").list.first(),
            delta_tf_p99=delta,
            noise=noise,
            delta_real_divergences=pl.col("real_divergences_b") - pl.col("real_divergences_a"),
            paths_changed=pl.col("real_divergences"),
        )
        .with_columns(effect_x_noise=ratio)
        .with_columns(
            effect=pl.when(above.fill_null(False))
            .then(pl.lit("above noise"))
            .when(pl.col("effect_x_noise").is_null() & pl.col("paths_changed").is_null())
            .then(pl.lit("not measured"))
            .otherwise(pl.lit("within noise"))
        )
        .select(EFFECTS)
        .sort("model", "setting", "target_a", "target_b")
    )
