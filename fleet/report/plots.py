"""The HTML report's plots of a run's tables, drawn with fleet.report.svg's primitives.

Each takes a frame with the columns of fleet.contracts.schema or fleet.analysis, draws one series
per model/target (labelled by the target alone when there is one model), and colours each series
by its target through `colors` (RunReport.colors), so a target keeps its colour in every plot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import polars as pl
import polars.selectors as cs

from fleet.report import svg
from fleet.report.svg import XY

_SCATTER_CAP = 4000  # points per series: beyond this an SVG gets slow to draw and no clearer
Colors = Mapping[str, str]


def _series(frame: pl.DataFrame, x: str, y: str, colors: Colors) -> tuple[dict[str, XY], dict[str, str]]:
    """({label: (xs, ys)}, {label: colour}) per model/target; the label is the target alone for one model."""
    one_model = frame["model"].n_unique() <= 1
    series: dict[str, XY] = {}
    label_colors: dict[str, str] = {}
    for (model, target), group in frame.partition_by("model", "target", as_dict=True, maintain_order=True).items():
        label = str(target) if one_model else f"{model}/{target}"
        series[label] = (group[x].to_list(), group[y].to_list())
        if str(target) in colors:
            label_colors[label] = colors[str(target)]
    return series, label_colors


def logprob_scatter(tokens: pl.DataFrame | pl.LazyFrame, colors: Colors) -> str:
    """Teacher-forced: the reference's logprob of each candidate token (x) vs the candidate's own (y)."""
    tok = tokens.lazy().filter(pl.col("ref_logprob").is_not_null())
    # The points off the diagonal are the story: keep the largest differences, thin out the rest.
    # Ties (many equal |dlogp|) go to the first positions in key order, so a page is the same each time.
    order, reverse = ["d", "prompt_set", "prompt_id", "position"], [False, True, True, True]
    shown = (
        tok.with_columns(d=(pl.col("logprob") - pl.col("ref_logprob")).abs())
        .group_by("model", "target")
        .agg(pl.all().top_k_by(order, _SCATTER_CAP, reverse=reverse))
        .explode(cs.exclude("model", "target"))
        .sort("model", "target", *order, descending=[False, False, *(not r for r in reverse)])
        .collect()
    )
    total = tok.select(pl.len()).collect().item()
    series, label_colors = _series(shown, "ref_logprob", "logprob", colors)
    title = f"Logprob, candidate vs reference (teacher-forced; {shown.height} of {total} positions)"
    return svg.scatter(
        series,
        title=title,
        x_label="reference logprob",
        y_label="candidate logprob",
        diagonal=True,
        colors=label_colors,
    )


def drift_by_position(tokens: pl.DataFrame | pl.LazyFrame, colors: Colors) -> str:
    """Mean teacher-forced |logprob - ref_logprob| per output position: does the error grow along the output?"""
    diff = (pl.col("logprob").cast(pl.Float64) - pl.col("ref_logprob")).abs()
    by_pos = (
        tokens.lazy()
        .filter(pl.col("ref_logprob").is_not_null())
        .group_by("model", "target", "position")
        .agg(d=diff.mean())
        .sort("model", "target", "position")
        .collect()
    )
    series, label_colors = _series(by_pos, "position", "d", colors)
    return svg.lines(
        series,
        title="Teacher-forced mean |Δlogprob| by position",
        x_label="output position",
        y_label="mean |Δlogprob| (nats)",
        colors=label_colors,
    )


def divergence_histogram(sequences: pl.DataFrame, colors: Colors, *, max_bins: int = 24) -> str:
    """Prompts per first-divergence position (analysis.sequences), binned; 'none' counts exact matches."""
    title = "First divergence position (prompts per bin; none = exact match)"
    if sequences.is_empty():
        return svg.placeholder(title, "no candidate sequences")
    top = max(int(sequences["tokens_total"].cast(pl.Int64).max() or 1), 1)  # type: ignore[arg-type]
    width = math.ceil(top / max_bins)
    n_bins = math.ceil(top / width)
    cats = [str(b) if width == 1 else f"{b * width}-{b * width + width - 1}" for b in range(n_bins)]
    binned = sequences.with_columns(
        bin=pl.col("first_divergence").floordiv(width).clip(upper_bound=n_bins - 1).fill_null(n_bins)
    )
    series, label_colors = _series(binned, "first_divergence", "bin", colors)
    counts = {label: [float(bins_.count(b)) for b in range(n_bins + 1)] for label, (_, bins_) in series.items()}
    return svg.bars(
        [*cats, "none"], counts, title=title, x_label="output position", y_label="prompts", colors=label_colors
    )


def latency_cdf(requests: pl.DataFrame, column: str, colors: Colors, *, name: str) -> str:
    """Empirical CDF of one latency column of the requests table (seconds), per target."""
    req = requests.filter(pl.col(column).is_not_null()).sort(column)
    n, i = pl.len().over("model", "target"), pl.int_range(pl.len()).over("model", "target")
    # A CDF of thousands of requests draws the same with a few hundred points.
    req = req.with_columns(q=(i + 1) / n).filter((i % (n // 400 + 1) == 0) | (i == n - 1))
    series, label_colors = _series(req, column, "q", colors)
    # Each curve rises from 0 at its fastest request, as a CDF does.
    series = {k: ([xs[0], *xs], [0.0, *qs]) for k, (xs, qs) in series.items()}
    return svg.lines(
        series,
        title=f"{name} CDF per target",
        x_label=f"{name} (s)",
        y_label="share of requests ≤ x",
        step=True,
        markers=False,
        colors=label_colors,
    )


def layer_errors(layers: pl.DataFrame, colors: Colors, *, metric: str = "rel_l2") -> str:
    """Per-layer error curves: `layers` (probes.layer_curve) has model, target, layer (0 = embeddings), `metric`."""
    series, label_colors = _series(layers.sort("layer"), "layer", metric, colors)
    # Errors start near 0 and grow; similarities sit near 1, where a zero-based axis would flatten them.
    return svg.lines(
        series,
        title=f"Per-layer {metric} vs reference",
        x_label="layer",
        y_label=metric,
        y_from_zero=not metric.startswith("cos"),
        colors=label_colors,
    )


def setting_effects(effects: pl.DataFrame) -> str:
    """Per matrix setting, the largest |Δ TF p99| over its pairs in units of the noise (above 1:
    beyond precision) and the greedy paths it changes beyond the noise (consistency.effects)."""
    title = "Which setting moves the outputs (max over pairs)"
    per = effects.group_by("setting", maintain_order=True).agg(
        pl.col("effect_x_noise").max(), pl.col("paths_changed").fill_null(0).sum()
    )
    series = {
        "|Δ TF p99| / noise": [float(v) if v is not None else math.nan for v in per["effect_x_noise"]],
        "greedy paths changed": [float(v) for v in per["paths_changed"]],
    }
    return svg.bars(per["setting"].to_list(), series, title=title, x_label="setting", y_label="x noise / prompts")


def throughput_vs_concurrency(scenarios: pl.DataFrame, colors: Colors) -> list[str]:
    """Output tok/s per concurrency level, one plot per scenario (perf.summary: scenario, level, output_tok_s)."""
    out = []
    for (scenario,), part in scenarios.partition_by("scenario", as_dict=True, maintain_order=True).items():
        series, label_colors = _series(part.sort("level"), "level", "output_tok_s", colors)
        title = f"Output tokens/s vs concurrency: {scenario}"
        out.append(
            svg.lines(series, title=title, x_label="concurrent requests", y_label="output tok/s", colors=label_colors)
        )
    return out


DRILL_PLOTS = 4  # divergences drawn; the text report's table has every one


def drilldown_curves(curve: pl.DataFrame, colors: Colors) -> list[str]:
    """Per divergence (the first DRILL_PLOTS), log10 rel L2 vs the reference across depth for each
    probed target, and the precision twin's times the margin's line is what it is judged against
    (drilldown.curve: depth 0 = embeddings, then per layer attention, MLP, output; the final norm)."""
    out = []
    keys = ["model", "diverging", "prompt_set", "prompt_id", "step"]
    for key, part in list(curve.partition_by(keys, as_dict=True, maintain_order=True).items())[:DRILL_PLOTS]:
        model, diverging, _, prompt_id, step = key
        series: dict[str, XY] = {}
        label_colors: dict[str, str] = {}
        for (target,), rows in part.partition_by("target", as_dict=True, maintain_order=True).items():
            series[str(target)] = (rows["depth"].to_list(), _log10(rows["rel_l2"]))
            if str(target) in colors:
                label_colors[str(target)] = colors[str(target)]
        twin = part.unique("depth", keep="first", maintain_order=True)
        series["precision twin"] = (twin["depth"].to_list(), _log10(twin["twin_rel_l2"]))
        out.append(
            svg.lines(
                series,
                title=f"{model}: prompt {prompt_id} ({diverging}), token {step}",
                x_label="depth (embeddings; per layer attention, MLP, output; norm)",
                y_label="log10 rel L2 vs reference",
                y_from_zero=False,
                colors=label_colors,
            )
        )
    return out


def _log10(values: pl.Series) -> list[float]:
    return [math.log10(v) if v is not None and v > 0 else math.nan for v in values.to_list()]


def parity_vs_load(levels: pl.DataFrame, colors: Colors) -> list[str]:
    """Per scenario, by concurrency level: TF p99 |dlogp| and real divergences of the parity prompts
    under load (fleet.analysis.load_parity.table), one line per target."""
    out = []
    for (scenario,), part in levels.partition_by("scenario", as_dict=True, maintain_order=True).items():
        part = part.sort("level")
        for column, y_label in (
            ("tf_p99_abs_logprob_diff", "TF p99 |dlogp| (nats)"),
            ("real_divergences", "real div."),
        ):
            series, label_colors = _series(part, "level", column, colors)
            title = f"Parity vs load: {y_label} by concurrency, {scenario}"
            out.append(
                svg.lines(series, title=title, x_label="concurrent requests", y_label=y_label, colors=label_colors)
            )
    return out


def sweep_curves(sweeps: pl.DataFrame, colors: Colors) -> list[str]:
    """Goodput req/s against the offered rate, one plot per swept scenario and level (perf.sweep_curve)."""
    out = []
    for (scenario, level), part in sweeps.partition_by("scenario", "level", as_dict=True, maintain_order=True).items():
        series, label_colors = _series(part.sort("offered_rps"), "offered_rps", "goodput_qps", colors)
        title = f"Goodput vs offered rate: {scenario} at concurrency {level}"
        out.append(
            svg.lines(series, title=title, x_label="offered req/s", y_label="goodput req/s", colors=label_colors)
        )
    return out
