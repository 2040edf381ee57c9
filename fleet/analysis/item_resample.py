"""Task accuracy and parity-under-load figures on bootstrap resamples: the intervals `fleet compare`
prints beside their deltas (the perf and parity figures': perf_resample.py, parity_resample.py).

* Task accuracy (accuracy_pct, task_accuracy_delta): the unit is the task item, a prompt of the
  model with an expected answer. Every target of a model is judged on the same drawn items, so a
  resample's task_accuracy_delta is a candidate's accuracy minus the reference's on the same items,
  as the report's is on all of them.
* Parity under load (load_real_divergences, load_batch_real_divergences): the unit is a target's
  parity prompt. Every level sends the same prompts, so a prompt is drawn once for all the target's
  levels, and a resample's figure is, as the report's, the most real divergences at any level:
  the drawn prompts' count at each level, its largest.
* Self-consistency (consistency_real_divergences): the unit is the model's prompt; a resample's
  figure is, per variant, the drawn prompts' real divergences summed over the pairs it is in.

Each run is resampled on its own (2,000 resamples, seed 0: draws for run A, then for run B, from one
generator per model or target). With every unit drawn once a resample gives the report's figure.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from fleet.analysis.bootstrap import draws
from fleet.analysis.perf_resample import RESAMPLES, bounds

Interval = tuple[str, str, str, float, float]  # model, target, metric, low, high
_ITEM = ["prompt_set", "prompt_id"]
# load_parity.per_target's figure -> the per-prompt column of load_parity.evaluate it counts
LOAD_FIGURES = {"load_real_divergences": "real", "load_batch_real_divergences": "real_vs_solo"}


def _matrix(frame: pl.DataFrame, rows: str, value: str, units: pl.DataFrame) -> tuple[list[str], np.ndarray]:
    """(row keys, [rows, units] values of `value`, NaN where a row lacks a unit or its value is null)."""
    keys = sorted(frame[rows].unique().to_list())
    cells = frame.join(units, on=_ITEM).select(rows, "_unit", _value=pl.col(value).cast(pl.Float64))
    out = np.full((len(keys), units.height), np.nan)
    index = {k: i for i, k in enumerate(keys)}
    row = np.array([index[k] for k in cells[rows].to_list()], dtype=np.int64)
    out[row, cells["_unit"].to_numpy()] = cells["_value"].fill_null(np.nan).to_numpy()
    return keys, out


def _units(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select(_ITEM).unique().sort(_ITEM).with_row_index("_unit").cast({"_unit": pl.Int64})


def _accuracy(judged: pl.DataFrame, reference: str, drawn: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """target -> accuracy_pct and task_accuracy_delta on each resample of one model's items."""
    targets, correct = _matrix(judged, "target", "correct", _units(judged))
    answered = ~np.isnan(correct)  # a target judged on this item (a null verdict counts nowhere, as in mean())
    w = drawn.astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        accuracy = 100 * (w @ np.where(answered, correct, 0.0).T) / (w @ answered.T)
    ref = accuracy[:, targets.index(reference)] if reference in targets else np.full(len(w), np.nan)
    return {
        t: {"accuracy_pct": accuracy[:, i], "task_accuracy_delta": accuracy[:, i] - ref} for i, t in enumerate(targets)
    }


def accuracy_intervals(
    judged_a: pl.DataFrame,
    judged_b: pl.DataFrame,
    reference: str,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> list[Interval]:
    """The 95 % interval of b - a of accuracy_pct and task_accuracy_delta of every target of a model
    both runs judged (`judged_*`: task_accuracy.judged), each run's task items resampled."""
    out = []
    for model in sorted(set(judged_a["model"]) & set(judged_b["model"])):
        rng = np.random.default_rng(seed)
        a, b = (j.filter(pl.col("model") == model) for j in (judged_a, judged_b))
        drawn_a, drawn_b = (draws(rng, _units(j).height, resamples) for j in (a, b))
        fig_a, fig_b = _accuracy(a, reference, drawn_a), _accuracy(b, reference, drawn_b)
        for target in sorted(fig_a.keys() & fig_b.keys()):
            for metric, values in fig_b[target].items():
                out.append((model, target, metric, *bounds(values - fig_a[target][metric])))
    return out


def _load(prompts: pl.DataFrame, drawn: np.ndarray) -> dict[str, np.ndarray]:
    """LOAD_FIGURES on each resample of one target's prompts (`prompts`: load_parity.evaluate's)."""
    units = _units(prompts)
    levels = prompts.with_columns(_level=pl.concat_str("scenario", pl.col("level").cast(pl.String), separator="@"))
    w = drawn.astype(float)
    out = {}
    for figure, column in LOAD_FIGURES.items():
        _, counted = _matrix(levels, "_level", column, units)
        out[figure] = (w @ np.nan_to_num(counted).T).max(axis=1)  # a prompt a level did not send counts 0
    return out


def load_intervals(
    prompts_a: pl.DataFrame, prompts_b: pl.DataFrame, *, resamples: int = RESAMPLES, seed: int = 0
) -> list[Interval]:
    """The 95 % interval of b - a of LOAD_FIGURES of every target both runs sent parity prompts under
    load (`prompts_*`: load_parity.evaluate's prompts), each run's prompts resampled."""
    keys = ["model", "target"]
    both = prompts_a.select(keys).unique().join(prompts_b.select(keys).unique(), on=keys).sort(keys)
    out = []
    for model, target in both.iter_rows():
        rng = np.random.default_rng(seed)
        mine = (pl.col("model") == model) & (pl.col("target") == target)
        a, b = prompts_a.filter(mine), prompts_b.filter(mine)
        drawn_a, drawn_b = (draws(rng, _units(p).height, resamples) for p in (a, b))
        fig_a, fig_b = _load(a, drawn_a), _load(b, drawn_b)
        out += [(model, target, figure, *bounds(fig_b[figure] - fig_a[figure])) for figure in LOAD_FIGURES]
    return out


def _variant_counts(pairs: pl.DataFrame) -> pl.DataFrame:
    """model, target (a variant), prompt_set, prompt_id, real: the prompt's real divergences over the
    judged pairs the variant is in (consistency.per_variant's sum, per prompt)."""
    judged = pairs.filter(pl.col("_judged")).with_columns(_real=(~pl.col("_near")).fill_null(False).cast(pl.Int64))
    sides = [judged.select("model", *_ITEM, "_real", target=side) for side in ("target_a", "target_b")]
    return pl.concat(sides).group_by("model", "target", *_ITEM).agg(real=pl.col("_real").sum())


def consistency_intervals(
    pairs_a: pl.DataFrame, pairs_b: pl.DataFrame, *, resamples: int = RESAMPLES, seed: int = 0
) -> list[Interval]:
    """The 95 % interval of b - a of consistency_real_divergences of every variant both runs compared
    (`pairs_*`: consistency.prompt_pairs), each run's prompts resampled."""
    counts_a, counts_b = _variant_counts(pairs_a), _variant_counts(pairs_b)
    keys = ["model", "target"]
    both = counts_a.select(keys).unique().join(counts_b.select(keys).unique(), on=keys).sort(keys)
    out = []
    for model, target in both.iter_rows():
        rng = np.random.default_rng(seed)
        mine = (pl.col("model") == model) & (pl.col("target") == target)
        a, b = counts_a.filter(mine), counts_b.filter(mine)
        figures = []
        for side in (a, b):
            units = _units(side)
            drawn = draws(rng, units.height, resamples)
            per_unit = side.join(units, on=_ITEM).sort("_unit")["real"].cast(pl.Float64).to_numpy()
            figures.append(drawn.astype(float) @ per_unit)
        out.append((model, target, "consistency_real_divergences", *bounds(figures[1] - figures[0])))
    return out
