"""Deep parity probes: full-distribution logprobs and layer-wise hidden states vs the reference.

Inputs are the probe tables of fleet.contracts.probe_schema.PROBE_TABLES ("logits", "layers"); every candidate
row is paired with the reference's row for the same (model, prompt_set, prompt_id, position or
layer). The vectors are list<float32> columns; the arithmetic is numpy in float64, row by row.
A pair whose inputs differ (other prompt token ids, positions or width) is not compared: its
metrics are null, `same_input` is false, and every summary over it is null, which a gate reports
as "not measured" rather than passing on the rows that were compared.

The metrics of one pair (per position: cosine, nmse, max_abs_err, kl, the top-k matches; per
layer: rel_l2, cosine, the error shares) are defined in fleet/analysis/probe_metrics.py. The
per-layer table (`layer_curve`) is the error-growth curve across depth.

Thresholds, in the style of Ascend's precision tools (msprobe compare):

* cosine > 0.99 is "acceptable", below 0.9 is a failure outright (msprobe's accuracy check also
  fails cosine < 0.99 together with max abs error > 0.001, and max abs error > 1, thresholds meant
  for single operators rather than a whole network's hidden states).
* The dual-thousandth standard ("双千指标") passes a tensor when fewer than 0.1 % of elements are
  off by more than 0.1 %: within_0p1pct >= 0.999, and likewise within_0p5pct >= 0.995. msprobe
  uses these shares as a trend indicator, not a pass criterion: a bfloat16 run cannot meet them
  against float32 (bfloat16 rounds each element by up to 2^-9 ≈ 0.2 %), so gate bfloat16 layers
  on cosine and rel_l2 and keep the shares for locating where drift starts.
* The seed reports' own verdicts: all layers cosine > 0.9998 and mean rel L2 < 1 % (001,
  float32 CPU vs bfloat16 NPU); logits normalized MSE < 1 %, cosine ≈ 1, top-1 100 % (002).

Gate metrics (fleet.gates.METRICS) are columns of `logits_summary` and `layer_summary`:
`logits_cosine_min`, `logits_kl_max`, `layer_cosine_min`, `layer_rel_l2_max`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import polars as pl
import pyarrow.compute as pc

from fleet.analysis.missing import strict as _strict
from fleet.analysis.parity import CAND, PROMPT, Frame, split
from fleet.analysis.probe_metrics import layer_metrics, logits_metrics

_CHUNK = 64  # rows converted to numpy at a time: bounds memory with 150k-entry vocabularies


# --- tables ----------------------------------------------------------------------------------

_LOGITS_METRICS = {
    "cosine": pl.Float64,
    "nmse": pl.Float64,
    "max_abs_err": pl.Float64,
    "kl": pl.Float64,
    "ref_top1": pl.Int64,
    "cand_top1": pl.Int64,
    "top1_match": pl.Boolean,
    "top5_match": pl.Boolean,
    "top5_overlap": pl.Float64,
}
_SPREAD = ["err_mean", "abs_err_p50", "abs_err_p99", "abs_err_max", "within_bound"]
_LAYER_METRICS = {
    "rel_l2": pl.Float64,
    "cosine": pl.Float64,
    "cosine_min": pl.Float64,
    "max_abs_err": pl.Float64,
    "within_0p1pct": pl.Float64,
    "within_0p5pct": pl.Float64,
}


def logits_errors(logits: Frame, reference: str) -> pl.DataFrame:
    """Per candidate (model, target, prompt_set, prompt_id, position) vs the reference's row.

    Output: model, target, prompt_set, prompt_id, position, same_input (both engines saw the
    same prompt token ids), cosine, nmse, max_abs_err, kl, ref_top1, cand_top1, top1_match,
    top5_match, top5_overlap (null where same_input is false).
    """
    ref, cand = split(logits, reference)
    on = [*PROMPT, "position"]
    pairs = (
        cand.select(*CAND, "position", _c="logprobs", _c_ids="prompt_token_ids")
        .join(ref.select(*on, _r="logprobs", _r_ids="prompt_token_ids"), on=on, how="inner")
        .with_columns(
            same_input=(pl.col("_c_ids") == pl.col("_r_ids")) & (pl.col("_c").list.len() == pl.col("_r").list.len())
        )
        .with_columns(pl.col("same_input").fill_null(False))
        .sort(*CAND, "position")
        .collect()
    )
    metrics = _pairwise(pairs, logits_metrics, shape=lambda row: (-1,))
    return pl.concat(
        [pairs.select(*CAND, "position", "same_input"), _frame(metrics, _LOGITS_METRICS)], how="horizontal"
    )


def logits_summary(errors: pl.DataFrame) -> pl.DataFrame:
    """One row per (model, target) from `logits_errors`: the gate metrics and their context.

    Output: model, target, n_prompts, n_positions, n_input_mismatch, logits_cosine_min,
    logits_cosine_mean, logits_nmse_max, logits_nmse_mean, logits_max_abs_err, logits_kl_max,
    logits_kl_mean, logits_top1_agreement, logits_top5_agreement. Null if any pair was not compared.
    """
    return (
        errors.group_by("model", "target")
        .agg(
            n_prompts=pl.struct("prompt_set", "prompt_id").n_unique(),
            n_positions=pl.len(),
            n_input_mismatch=(~pl.col("same_input")).sum(),
            logits_cosine_min=_strict("cosine", pl.col("cosine").min()),
            logits_cosine_mean=_strict("cosine", pl.col("cosine").mean()),
            logits_nmse_max=_strict("nmse", pl.col("nmse").max()),
            logits_nmse_mean=_strict("nmse", pl.col("nmse").mean()),
            logits_max_abs_err=_strict("max_abs_err", pl.col("max_abs_err").max()),
            logits_kl_max=_strict("kl", pl.col("kl").max()),
            logits_kl_mean=_strict("kl", pl.col("kl").mean()),
            logits_top1_agreement=_strict("top1_match", pl.col("top1_match").mean()),
            logits_top5_agreement=_strict("top5_match", pl.col("top5_match").mean()),
        )
        .sort("model", "target")
    )


def logits_distribution(logits: Frame, reference: str, *, bound: float = 0.06) -> pl.DataFrame:
    """How the elementwise errors spread over the whole vocabulary, per (model, target): the Qwen2.5
    report's section 5.4 ("most |errors| < 0.06, no systematic bias"), on logprobs (nats).

    Output: model, target, n_elements, err_mean (signed mean of logprob_c - logprob_r: a bias),
    abs_err_p50, abs_err_p99, abs_err_max, within_bound (share of |error| < `bound`), bound.
    Only pairs with the same input count; none compared: no row. A NaN logprob makes the figures null;
    -inf on one side only is an infinite error (the other side gives the token mass), not skipped.
    """
    ref, cand = split(logits, reference)
    on = [*PROMPT, "position"]
    pairs = (
        cand.select(*CAND, "position", _c="logprobs", _c_ids="prompt_token_ids")
        .join(ref.select(*on, _r="logprobs", _r_ids="prompt_token_ids"), on=on, how="inner")
        .filter((pl.col("_c_ids") == pl.col("_r_ids")) & (pl.col("_c").list.len() == pl.col("_r").list.len()))
        .collect()
    )
    rows = []
    for (model, target), group in pairs.group_by("model", "target", maintain_order=True):
        sides = list(zip(_arrays(group["_r"]), _arrays(group["_c"]), strict=True))
        masked = np.concatenate([np.isneginf(r) & np.isneginf(c) for r, c in sides])  # masked vocabulary: no error
        errors = np.concatenate([c - r for r, c in sides])[~masked]
        figures: dict[str, float | None] = dict.fromkeys(_SPREAD)
        if not np.isnan(errors).any():  # a NaN logprob: the spread is not measured, whatever the rest says
            size = np.abs(errors)
            figures = {
                "err_mean": float(errors.mean()),
                "abs_err_p50": float(np.quantile(size, 0.5)),
                "abs_err_p99": float(np.quantile(size, 0.99)),
                "abs_err_max": float(size.max()),
                "within_bound": float(np.mean(size < bound)),
            }
        rows.append({"model": model, "target": target, "n_elements": int(errors.size), **figures, "bound": bound})
    return (
        pl.DataFrame(rows, schema_overrides=dict.fromkeys(_SPREAD, pl.Float64)).sort("model", "target")
        if rows
        else pl.DataFrame()
    )


def layer_errors(layers: Frame, reference: str) -> pl.DataFrame:
    """Per candidate (model, target, prompt_set, prompt_id, layer) vs the reference's row.

    Output: model, target, prompt_set, prompt_id, layer, kind, n_positions, same_input (same
    prompt token ids, positions and width), rel_l2, cosine, cosine_min, max_abs_err,
    within_0p1pct, within_0p5pct (null where same_input is false).
    """
    ref, cand = split(layers, reference)
    on = [*PROMPT, "layer"]
    same = ["prompt_token_ids", "positions", "hidden_size"]
    pairs = (
        cand.select(*CAND, "layer", "kind", "n_positions", *same, _c="hidden")
        .join(ref.select(*on, *same, _r="hidden"), on=on, how="inner", suffix="_ref")
        .with_columns(same_input=pl.all_horizontal(pl.col(c) == pl.col(f"{c}_ref") for c in same).fill_null(False))
        .sort(*CAND, "layer")
        .collect()
    )
    metrics = _pairwise(pairs, layer_metrics, shape=lambda row: (row["n_positions"], row["hidden_size"]))
    keep = pairs.select(*CAND, "layer", "kind", "n_positions", "same_input")
    return pl.concat([keep, _frame(metrics, _LAYER_METRICS)], how="horizontal")


def layer_curve(errors: pl.DataFrame) -> pl.DataFrame:
    """The error-growth curve: one row per (model, target, layer) over the probe's prompts.

    Output: model, target, layer, kind, n_prompts, rel_l2 (mean over prompts), rel_l2_max,
    cosine (mean), cosine_min (lowest position of any prompt), max_abs_err, within_0p1pct and
    within_0p5pct (shares over all the layer's elements). fleet.svg.layer_errors plots it.
    """
    weight = pl.col("n_positions").cast(pl.Float64)
    return (
        errors.group_by("model", "target", "layer")
        .agg(
            kind=pl.col("kind").first(),
            n_prompts=pl.len(),
            rel_l2=_strict("rel_l2", pl.col("rel_l2").mean()),
            rel_l2_max=_strict("rel_l2", pl.col("rel_l2").max()),
            cosine=_strict("cosine", pl.col("cosine").mean()),
            cosine_min=_strict("cosine_min", pl.col("cosine_min").min()),
            max_abs_err=_strict("max_abs_err", pl.col("max_abs_err").max()),
            within_0p1pct=_strict("within_0p1pct", (pl.col("within_0p1pct") * weight).sum() / weight.sum()),
            within_0p5pct=_strict("within_0p5pct", (pl.col("within_0p5pct") * weight).sum() / weight.sum()),
        )
        .sort("model", "target", "layer")
    )


def layer_summary(curve: pl.DataFrame) -> pl.DataFrame:
    """One row per (model, target) from `layer_curve`: the gate metrics and where the error peaks.

    Output: model, target, n_layers, layer_cosine_min (lowest per-layer mean cosine),
    layer_rel_l2_max (highest per-layer rel_l2), layer_rel_l2_mean (their mean over layers: the
    001 report's "Average Rel L2"), worst_layer (of layer_rel_l2_max), layer_within_0p1pct_min,
    layer_within_0p5pct_min. Null if any layer was not compared.
    """
    return (
        curve.group_by("model", "target")
        .agg(
            n_layers=pl.len(),
            layer_cosine_min=_strict("cosine", pl.col("cosine").min()),
            layer_rel_l2_max=_strict("rel_l2", pl.col("rel_l2").max()),
            layer_rel_l2_mean=_strict("rel_l2", pl.col("rel_l2").mean()),
            worst_layer=pl.col("layer").sort_by("rel_l2", descending=True, nulls_last=True).first(),
            layer_within_0p1pct_min=_strict("within_0p1pct", pl.col("within_0p1pct").min()),
            layer_within_0p5pct_min=_strict("within_0p5pct", pl.col("within_0p5pct").min()),
        )
        .sort("model", "target")
    )


# --- helpers ---------------------------------------------------------------------------------


def _pairwise(
    pairs: pl.DataFrame,
    metric: Callable[[np.ndarray, np.ndarray], dict[str, Any]],
    *,
    shape: Callable[[dict[str, Any]], tuple[int, ...]],
) -> list[dict[str, Any] | None]:
    """metric(ref, cand) for every row of `pairs` (columns _r, _c) whose same_input holds, else None."""
    out: list[dict[str, Any] | None] = []
    for chunk in pairs.iter_slices(_CHUNK):
        rows = chunk.drop("_r", "_c").iter_rows(named=True)
        for row, r, c in zip(rows, _arrays(chunk["_r"]), _arrays(chunk["_c"]), strict=True):
            out.append(metric(r.reshape(shape(row)), c.reshape(shape(row))) if row["same_input"] else None)
    return out


def _arrays(series: pl.Series) -> Iterator[np.ndarray]:
    """A list<float32> column as one float64 array per row, without a Python float per element."""
    arrow = series.to_arrow()
    lengths = pc.list_value_length(arrow).fill_null(0).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(arrow).to_numpy(zero_copy_only=False).astype(np.float64)
    return iter(np.split(flat, np.cumsum(lengths)[:-1]))


def _frame(rows: list[dict[str, Any] | None], schema: Mapping[str, type[pl.DataType]]) -> pl.DataFrame:
    empty = dict.fromkeys(schema)
    return pl.DataFrame([row or empty for row in rows], schema=schema)
