"""The drill-down: at which layer, and which part of it, a real divergence starts.

`points` reads a model's real divergences from the stored rows (fleet/analysis/divergence.py's
rule: not near ties) and gives the driver each one's prefix, the prompt + the output tokens the
candidate and the reference share; the driver then runs the layer probe there with sub-layers
(fleet/run/drill.py) on the reference, its precision twin at the candidate's dtype, and the hf
candidates. The last prefix position is where they disagree on the next token.

Per probed target and prefix, every row (layer, kind) is compared with the reference's
(fleet/analysis/probe_metrics.py `layer_metrics`): `rel_l2` = ||h - h_ref|| / ||h_ref||, and the twin's
`twin_rel_l2` the same way. A row **exceeds precision** when

    rel_l2 > margin * max(twin_rel_l2, FLOOR)

(`drilldown.margin`, 2 by default; FLOOR keeps a float32 twin's exact zeros, at the embeddings,
from flagging a candidate's last-bit noise). Rows are taken in depth order (embeddings, then per
decoder layer its attention output, its MLP output and its output, then the final norm), and the
first that exceeds is where the error starts: "layer 14 (attention output)". A candidate that never
exceeds diverged at a near tie of its own precision's making, beyond the near-tie rule's threshold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from fleet.analysis import divergence, noise_model, probe_metrics
from fleet.contracts.spec import DrillPoint
from fleet.results import reader

FLOOR = 1e-6  # relative L2 below this is float32 noise whatever the twin shows
DEFAULT_MARGIN = 2.0
KIND_ORDER = {"embed": 0, "attention": 1, "mlp": 2, "decoder": 3, "norm": 4}
KIND_LABEL = {
    "embed": "embeddings",
    "attention": "attention output",
    "mlp": "MLP output",
    "decoder": "layer output",
    "norm": "final norm",
}
POINT = ["model", "diverging", "prompt_set", "prompt_id", "step"]


def points(run_dir: str | Path, model: str) -> list[DrillPoint]:
    """The model's real divergences, at most `drilldown.max_prompts` per candidate (earliest in the
    output first), each with its prefix: the reference's prompt ids + its first `step` output ids."""
    info = reader.read_info(run_dir)
    options = info.manifest_resolved.get("drilldown") or {}
    tables = reader.load(run_dir)
    requests = tables["requests"].filter(pl.col("model") == model)
    tokens = tables["tokens"].filter(pl.col("model") == model)
    spec = noise_model.NoiseSpec.from_info(info)
    found = (
        divergence.divergences(requests, tokens, info.reference, spec=spec)
        .filter(pl.col("kind") == "divergence", pl.col("first_divergence").is_not_null())
        .sort("target", "first_divergence", "prompt_set", "prompt_id")
        .group_by("target", maintain_order=True)
        .head(int(options.get("max_prompts") or 8))
    )
    ref = (
        requests.filter(pl.col("target") == info.reference)
        .select("prompt_set", "prompt_id", "prompt_token_ids", "output_token_ids")
        .collect()
    )
    rows = found.join(ref, on=["prompt_set", "prompt_id"], how="inner").sort("target", "first_divergence")
    return [
        DrillPoint(
            r["target"],
            r["prompt_set"],
            r["prompt_id"],
            int(r["first_divergence"]),
            tuple(r["prompt_token_ids"] + r["output_token_ids"][: r["first_divergence"]]),
        )
        for r in rows.iter_rows(named=True)
    ]


def curve(
    drilldown: pl.LazyFrame | pl.DataFrame,
    reference: str,
    *,
    spec: noise_model.NoiseSpec | None = None,
    margin: float = DEFAULT_MARGIN,
) -> pl.DataFrame:
    """Per probed target and divergence, the error at every (layer, kind) in depth order; the twin
    compared is the one at the diverging candidate's dtype (`spec`, from run.json).

    Output: model, diverging, prompt_set, prompt_id, step, target (the probed hf target), layer, kind,
    rel_l2, cosine, twin_rel_l2 (the reference's precision twin at the diverging candidate's dtype;
    null without one), ratio (rel_l2 / max(twin, FLOOR)), exceeds, depth (0, 1, ... in depth order).
    """
    frame = drilldown.lazy().collect()
    if frame.is_empty():
        return pl.DataFrame()
    on = [*POINT, "layer", "kind"]
    ref = frame.filter((pl.col("target") == reference) & pl.col("twin_dtype").is_null())
    others = frame.filter((pl.col("target") != reference) | pl.col("twin_dtype").is_not_null())
    pairs = others.join(ref.select(*on, _r="hidden", _r_ids="prompt_token_ids"), on=on, how="inner")
    rows = []
    for row in pairs.iter_rows(named=True):
        same = row["prompt_token_ids"] == row["_r_ids"]
        shape = (row["n_positions"], row["hidden_size"])
        m = probe_metrics.layer_metrics(_array(row["_r"], shape), _array(row["hidden"], shape)) if same else {}
        rows.append(
            {
                **{k: row[k] for k in (*on, "target", "twin_dtype")},
                "rel_l2": m.get("rel_l2"),
                "cosine": m.get("cosine"),
            }
        )
    metrics = pl.DataFrame(rows, schema_overrides={"rel_l2": pl.Float64, "cosine": pl.Float64, "twin_dtype": pl.String})
    spec = spec or noise_model.NoiseSpec()
    dtype_of = pl.struct("model", "diverging").map_elements(
        lambda k: spec.dtype(k["model"], k["diverging"]), return_dtype=pl.String
    )
    twin = metrics.filter(pl.col("twin_dtype") == dtype_of).select(*on, twin_rel_l2="rel_l2")
    cand = metrics.filter(pl.col("twin_dtype").is_null()).drop("twin_dtype")
    depth = pl.col("kind").replace_strict(KIND_ORDER, default=9, return_dtype=pl.Int32)
    ratio = pl.col("rel_l2") / pl.max_horizontal(pl.col("twin_rel_l2").fill_null(0.0), pl.lit(FLOOR))
    return (
        cand.join(twin, on=on, how="left")
        .with_columns(ratio=ratio)
        .with_columns(exceeds=(pl.col("ratio") > margin).fill_null(False))
        .sort(*POINT, "target", "layer", depth)
        .with_columns(depth=pl.int_range(pl.len()).over(*POINT, "target"))
        .select(*POINT, "target", "layer", "kind", "rel_l2", "cosine", "twin_rel_l2", "ratio", "exceeds", "depth")
    )


def first_exceeding(errors: pl.DataFrame) -> pl.DataFrame:
    """Per probed target and divergence, the first (layer, kind) in depth order that exceeds precision.

    Output: model, diverging, prompt_set, prompt_id, step, target, first_layer, first_kind, where
    ("layer 14 (attention output)"; null when no row exceeds), rel_l2 and twin_rel_l2 there,
    n_layers (the decoder layers probed), finding (the report's sentence).
    """
    if errors.is_empty():
        return pl.DataFrame()
    keys = [*POINT, "target"]
    first = errors.filter(pl.col("exceeds")).sort("depth").group_by(keys).first()
    n_layers = errors.filter(pl.col("kind") == "decoder").group_by(keys).agg(n_layers=pl.col("layer").n_unique())
    out = (
        errors.select(keys)
        .unique()
        .join(first.select(*keys, "layer", "kind", "rel_l2", "twin_rel_l2"), on=keys, how="left")
        .join(n_layers, on=keys, how="left")
        .rename({"layer": "first_layer", "kind": "first_kind"})
        .sort(keys)
    )
    where = [_where(r) for r in out.iter_rows(named=True)]
    return out.with_columns(where=pl.Series(where, dtype=pl.String)).with_columns(
        finding=pl.Series([_finding(r) for r in out.with_columns(where=pl.Series(where)).iter_rows(named=True)])
    )


def _where(row: dict[str, Any]) -> str | None:
    if row["first_layer"] is None:
        return None
    kind = row["first_kind"]
    if kind in ("embed", "norm"):
        return KIND_LABEL[kind]
    return f"layer {row['first_layer']} ({KIND_LABEL[kind]})"


def _finding(row: dict[str, Any]) -> str:
    head = f"prompt {row['prompt_id']} diverges at token {row['step']}"
    proxy = "" if row["target"] == row["diverging"] else f" (on {row['target']})"
    if row["where"] is None:
        return f"{head}; no layer's error exceeds precision{proxy}"
    return f"{head}; the error first exceeds precision at {row['where']}{proxy}"


def _array(values: Any, shape: tuple[int, int]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(shape)
