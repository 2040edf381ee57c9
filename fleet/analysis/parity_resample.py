"""A run's parity figures on bootstrap resamples of its prompts: the interval `fleet compare`
prints beside a parity delta (the prompt is the unit, as in the noise model, fleet/analysis/bootstrap.py).

Each figure is the one fleet/analysis/parity.py and divergence.py give, recomputed on the drawn
prompts (a prompt drawn twice counts twice): rates and means as weighted sums over per-prompt sums
and counts, the TF p99 with bootstrap.resampled_quantiles (numpy's "linear" quantile of the drawn
prompts' values), the TF max as the largest value of a drawn prompt, and the divergence counts as
counts of the drawn prompts. Ratio-of-sums figures take per-prompt sums, so that a resample weighs
each drawn token as the report does: mae and kl_topk_mean a sum and a count per prompt, pearson_r
the six sums of its common-prefix pairs (n, x, y, x^2, y^2, xy, the values centred on the
candidate's means first: r does not change, the cancellation in x^2 - mean^2 does), and
first_divergence_mean each diverged prompt's first divergence. With every prompt drawn once each
is the report's figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from fleet.analysis import divergence, perf_resample, ties
from fleet.analysis.bootstrap import draws, resampled_quantiles
from fleet.analysis.parity import CAND, PROMPT, RUN, split
from fleet.results import prompt_stats

_F64 = pl.Float64
# Per-prompt columns (NaN: the prompt has no value) whose figure is their mean over prompts.
_PROMPT_MEANS = {
    "seq_match_rate": "_exact",
    "first_top1_agreement": "_first",
    "first_logprob_diff_mean": "_first_lp",
    "first_prob_rel_err_mean": "_first_rel",
    "first_top1_agreement_excl_ties": "_first_ok",
    "seq_match_rate_excl_ties": "_not_real",
    "first_divergence_mean": "_first_divergence",
}
# Per-prompt (sum, count) columns whose figure is sum / count over the drawn prompts.
_PROMPT_RATIOS = {
    "token_match_rate": ("_matched", "_total"),
    "tf_top1_agreement": ("_agreed", "_scored"),
    "mae": ("_abs_sum", "_pairs"),
    "kl_topk_mean": ("_kl_sum", "_kl_n"),
}
_PEARSON = ("_pairs", "_sx", "_sy", "_sxx", "_syy", "_sxy")  # per prompt, of centred common-prefix pairs
# A variance this small relative to the mean square is rounding: the values were equal (r undefined).
_FLAT = 1e-12
# Per-prompt columns whose figure is their sum over prompts.
_PROMPT_COUNTS = {
    "real_divergences": "_real",
    "near_ties": "_tie",
    "n_diverged": "_diverged",
    "tokens_matched": "_matched",
    "tokens_total": "_total",
}
RESAMPLED = sorted(
    {*_PROMPT_MEANS, *_PROMPT_COUNTS, *_PROMPT_RATIOS, "pearson_r"}
    | {f"tf_{s}_abs_logprob_diff" for s in ("mean", "max", "p99")}
)


@dataclass(frozen=True)
class Prompts:
    """One candidate's prompts (in key order) as arrays: per-prompt figures and its TF values."""

    columns: dict[str, np.ndarray]  # per prompt: _exact, _first, _real, _tie, _diverged, _matched, _total, ...
    tf_diff: np.ndarray  # every scored |logprob - ref_logprob| (NaN kept: then no TF figure)
    tf_prompt: np.ndarray  # the prompt of each value

    @property
    def n_prompts(self) -> int:
        return len(self.columns["_exact"])

    def figure(self, metric: str, drawn: np.ndarray) -> np.ndarray:
        """`metric` on each resample (rows of `drawn`: how often each prompt is drawn)."""
        w, c = drawn.astype(float), self.columns
        with np.errstate(divide="ignore", invalid="ignore"):
            if metric in _PROMPT_MEANS:
                x = c[_PROMPT_MEANS[metric]]
                return (w @ np.nan_to_num(x)) / (w @ ~np.isnan(x))
            if metric in _PROMPT_COUNTS:
                return w @ c[_PROMPT_COUNTS[metric]]
            if metric in _PROMPT_RATIOS:
                total, count = _PROMPT_RATIOS[metric]
                return (w @ c[total]) / (w @ c[count])
            if metric == "pearson_r":
                return _pearson(*(w @ c[name] for name in _PEARSON))
            values, unit = self.tf_diff, self.tf_prompt
            if not len(values) or np.isnan(values).any():  # the report's figure is null: nothing to resample
                return np.full(len(drawn), np.nan)
            if metric == "tf_mean_abs_logprob_diff":
                sums = np.bincount(unit, weights=values, minlength=self.n_prompts)
                return (w @ sums) / (w @ np.bincount(unit, minlength=self.n_prompts))
            if metric == "tf_max_abs_logprob_diff":
                top = np.full(self.n_prompts, -np.inf)
                np.maximum.at(top, unit, values)
                out = np.where(drawn > 0, top, -np.inf).max(axis=1)
                return np.where(np.isfinite(out), out, np.nan)
            if metric == "tf_p99_abs_logprob_diff":
                return resampled_quantiles(values, unit, drawn, divergence.NOISE_QUANTILE)
        raise ValueError(f"no resampled parity figure {metric!r}; known: {', '.join(RESAMPLED)}")


def _pearson(
    n: np.ndarray, sx: np.ndarray, sy: np.ndarray, sxx: np.ndarray, syy: np.ndarray, sxy: np.ndarray
) -> np.ndarray:
    """Pearson r from the sums of each resample (NaN, as the report's null: under two pairs, or no spread)."""
    mx, my = sx / n, sy / n
    var_x, var_y = sxx / n - mx * mx, syy / n - my * my
    flat = (var_x <= _FLAT * sxx / n) | (var_y <= _FLAT * syy / n) | (n < 2)
    return np.where(flat, np.nan, (sxy / n - mx * my) / np.sqrt(np.abs(var_x * var_y)))


def prompt_frame(seqs: pl.DataFrame, first: pl.DataFrame, per_prompt: pl.DataFrame) -> pl.DataFrame:
    """CAND and the per-prompt columns `Prompts` reads, one row per candidate prompt (of parity.sequences),
    from the report's sequences, first step and divergences (NaN where a prompt has no value)."""
    kind, divergence_at = pl.col("kind"), pl.col("_at")
    first_ok = divergence_at.is_null() | (divergence_at > 0) | (kind == "near tie")
    return (
        seqs.select(*CAND, "exact_match", "tokens_matched", "tokens_total", "first_divergence")
        .join(first.select(*CAND, "top1_match", "logprob_diff", "rel_err"), on=CAND, how="left")
        .join(per_prompt.select(*CAND, "kind", _at="first_divergence", _classified=pl.lit(True)), on=CAND, how="left")
        .select(
            *CAND,
            _exact=_per_prompt(pl.col("exact_match")),
            _first=_per_prompt(pl.col("top1_match")),
            _first_lp=_per_prompt(pl.col("logprob_diff")),
            _first_rel=_per_prompt(pl.col("rel_err")),
            # as divergence.summary_of: over the classified prompts
            _first_ok=_per_prompt(pl.when(pl.col("_classified")).then(first_ok)),
            _not_real=_per_prompt(kind != "divergence"),
            _matched=pl.col("tokens_matched").cast(_F64).fill_null(0),
            _total=pl.col("tokens_total").cast(_F64).fill_null(0),
            _diverged=pl.col("first_divergence").is_not_null().cast(_F64),
            _first_divergence=pl.col("first_divergence").cast(_F64).fill_null(np.nan),  # NaN: not diverged
            _real=(kind == "divergence").fill_null(False).cast(_F64),
            _tie=(kind == "near tie").fill_null(False).cast(_F64),
        )
        .sort(CAND)
    )


def _per_prompt(value: pl.Expr) -> pl.Expr:
    """A per-prompt value as Float64, NaN where the prompt has none; NaN for every prompt of a
    candidate with a NaN value, whose figure the report shows as null (fleet/analysis/missing.py)."""
    value = value.cast(_F64)
    return pl.when(value.is_nan().any().over(RUN)).then(np.nan).otherwise(value.fill_null(np.nan))


def candidates(
    prompts: pl.DataFrame, tokens: pl.LazyFrame, reference: str, *, stats: pl.LazyFrame | None = None
) -> dict[tuple[str, str], Prompts]:
    """(model, target) -> its Prompts: `prompts` from prompt_frame, the TF values and the per-prompt
    sums from the token rows, one candidate at a time: its logprobs and the reference's free-running
    logprob at the same position (the common prefix); the tie-aware agreement and KL sums from
    `stats` (the run's prompt_stats, which hold them per prompt) or, without, from the top-k lists."""
    ref_tok, cand_tok = split(tokens, reference)
    lp, ref_lp = pl.col("logprob").cast(_F64), pl.col("ref_logprob").cast(_F64)
    per_row = {"_lp": lp, "_diff": (lp - ref_lp).abs()}
    if stats is None:
        k = ties.longest_topk(cand_tok)
        per_row |= {
            "_agreed": ties.top1_agreement(k),
            "_kl": pl.when(prompt_stats.both_topk()).then(prompt_stats.kl(k)),
        }
    out = {}
    for (model, target), part in prompts.group_by(RUN, maintain_order=True):
        index = part.select(*CAND, "_first_divergence").with_row_index("_p")
        mine = (pl.col("model") == model) & (pl.col("target") == target)
        rows = (
            cand_tok.filter(mine)
            .select(*CAND, "position", **per_row)
            .join(
                ref_tok.filter(pl.col("model") == model).select(*PROMPT, "position", _ref_lp=lp),
                on=[*PROMPT, "position"],
                how="left",
            )
            .collect()
            .join(index, on=CAND, how="inner")
        )
        unit = rows["_p"].cast(pl.Int64).to_numpy()
        columns = {c: part[c].to_numpy() for c in part.columns if c.startswith("_")}
        columns |= _prefix_sums(rows, unit, len(index))
        columns |= _topk_sums(rows, unit, len(index)) if stats is None else _stats_sums(stats.filter(mine), index)
        scored = rows["_diff"].is_not_null().to_numpy()
        out[(str(model), str(target))] = Prompts(columns, rows["_diff"].to_numpy()[scored], unit[scored])
    return out


def _stats_sums(stats: pl.LazyFrame, index: pl.DataFrame) -> dict[str, np.ndarray]:
    """The agreement and KL sums of `_topk_sums`, per prompt of `index`, from the candidate's prompt_stats
    rows (what from_stats.figures sums: top1_agreed / top1_scored, kl_sum / kl_positions)."""
    sums = (
        index.lazy()
        .join(
            stats.select(*CAND, "top1_agreed", "top1_scored", "kl_sum", "kl_positions", "kl_nan"), on=CAND, how="left"
        )
        .sort("_p")
        .collect()
    )
    out = {
        name: sums[column].cast(_F64).fill_null(0).to_numpy()
        for name, column in (("_agreed", "top1_agreed"), ("_scored", "top1_scored"), ("_kl_n", "kl_positions"))
    }
    out["_kl_sum"] = sums["kl_sum"].cast(_F64).fill_null(0).to_numpy()
    if sums["kl_nan"].fill_null(False).any():  # the report's kl_topk_mean is null
        out["_kl_sum"] = np.full(index.height, np.nan)
    return out


def _summed(unit: np.ndarray, n_prompts: int, values: np.ndarray | None = None) -> np.ndarray:
    """Per prompt, the sum of `values` (their count without) of the rows `unit` codes."""
    return np.bincount(unit, weights=values, minlength=n_prompts).astype(float)


def _whole(sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A NaN among a figure's values makes every prompt's sum NaN, so that every resample is NaN
    where the report's figure is null (fleet/analysis/missing.py)."""
    return {name: np.full(len(v), np.nan) if np.isnan(v).any() else v for name, v in sums.items()}


def _topk_sums(rows: pl.DataFrame, unit: np.ndarray, n_prompts: int) -> dict[str, np.ndarray]:
    """Per prompt, of a candidate's token rows (`unit`: each row's prompt): tie-aware top-1 agreements
    and scored positions, KL sum and count."""
    agreed = rows["_agreed"].cast(_F64).to_numpy()  # null (unscored): NaN
    scored, has_kl = ~np.isnan(agreed), rows["_kl"].is_not_null().to_numpy()
    out = {
        "_agreed": _summed(unit[scored], n_prompts, agreed[scored]),
        "_scored": _summed(unit[scored], n_prompts),
    }
    out |= {"_kl_sum": _summed(unit[has_kl], n_prompts, rows["_kl"].to_numpy()[has_kl])}
    return _whole(out | {"_kl_n": _summed(unit[has_kl], n_prompts)})


def _prefix_sums(rows: pl.DataFrame, unit: np.ndarray, n_prompts: int) -> dict[str, np.ndarray]:
    """Per prompt, of its common prefix: positions before the first divergence (all of them if none)
    where the reference has its own row, as parity.parity joins the two sides: the pairs, their
    |d| sum, and the sums Pearson r needs."""
    first, position = rows["_first_divergence"].to_numpy(), rows["position"].to_numpy()
    prefix = rows["_ref_lp"].is_not_null().to_numpy() & (np.isnan(first) | (position < first))
    at, x, y = unit[prefix], rows["_lp"].to_numpy()[prefix], rows["_ref_lp"].to_numpy()[prefix]
    out = {"_pairs": _summed(at, n_prompts), "_abs_sum": _summed(at, n_prompts, np.abs(x - y))}
    if x.size:  # r does not move; the sums of squares lose no digits to the means
        x, y = x - x.mean(), y - y.mean()
    sums = (("x", x), ("y", y), ("xx", x * x), ("yy", y * y), ("xy", x * y))
    return _whole(out | {f"_s{name}": _summed(at, n_prompts, v) for name, v in sums})


def delta_intervals(
    a: Prompts, b: Prompts, *, resamples: int = perf_resample.RESAMPLES, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """metric -> the 95 % interval of b - a of each RESAMPLED figure, each run's prompts resampled
    independently (one set of draws for every figure: the same resamples, drawn once)."""
    rng = np.random.default_rng(seed)
    drawn_a, drawn_b = draws(rng, a.n_prompts, resamples), draws(rng, b.n_prompts, resamples)
    return {m: perf_resample.bounds(b.figure(m, drawn_b) - a.figure(m, drawn_a)) for m in RESAMPLED}
