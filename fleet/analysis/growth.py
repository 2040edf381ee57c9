"""How the layer probe's error grows with depth: a linear fit of Rel L2 over the decoder layers,
as seed report 001 states it ("error accumulates linearly, R² = ...")."""

from __future__ import annotations

import numpy as np
import polars as pl


def linear_fit(curve: pl.DataFrame) -> pl.DataFrame:
    """Per (model, target) of probes.layer_curve: slope, intercept and R² of rel_l2 ~ layer over
    the decoder layers; no row where fewer than 3 layers or a non-finite error leave nothing to fit."""
    rows = []
    decoders = curve.filter(pl.col("kind") == "decoder").sort("layer")
    for (model, target), group in decoders.group_by("model", "target", maintain_order=True):
        x, y = group["layer"].to_numpy().astype(float), group["rel_l2"].to_numpy().astype(float)
        if len(x) < 3 or not np.isfinite(y).all():
            continue
        slope, intercept = np.polyfit(x, y, 1)
        residual = float(np.sum((y - (slope * x + intercept)) ** 2))
        r2 = 1 - residual / max(float(np.sum((y - y.mean()) ** 2)), 1e-300)  # a flat curve: no spread to explain
        rows.append({"model": model, "target": target, "slope": float(slope), "intercept": float(intercept), "r2": r2})
    schema = {"model": pl.String, "target": pl.String, "slope": pl.Float64, "intercept": pl.Float64, "r2": pl.Float64}
    return pl.DataFrame(rows, schema=schema)
