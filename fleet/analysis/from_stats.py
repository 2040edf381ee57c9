"""The report's token figures from prompt_stats (fleet/results/prompt_stats.py): prompts joined with
prompts, never token rows with token rows.

Each function returns what its namesake over token rows returns (fleet/analysis/parity.py,
divergence.py, noise_model.py), and the figures are the same: sums, extrema and exact quantiles
over the same values, the bootstrap over the same resamples (fleet/analysis/bootstrap.py). Only the
order of floating-point additions differs. The run's `prompt_stats` must cover every tokens file
and hold contiguous positions (`usable`); otherwise the report reads token rows as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from fleet.analysis import aligned, divergence, noise_model, parity
from fleet.analysis.missing import no_nan
from fleet.analysis.noise_model import NoiseSpec
from fleet.analysis.parity import CAND, PROMPT, RUN

_F64 = pl.Float64
_CAND_COLUMNS = ["n_positions", "first_token_id", "first_top1_tied", "logprobs", "ref_logprobs", "twin_logprobs"]
_CAND_COLUMNS += ["top1_scored", "top1_agreed", "kl_positions", "kl_sum", "kl_nan"]


def usable(stats: pl.LazyFrame) -> bool:
    """Whether every prompt's lists are indexed by position (a prompt with a gap in its positions
    would be compared at the wrong ones)."""
    return bool(stats.select(pl.col("contiguous").fill_null(False).all()).collect().item())


@dataclass(frozen=True)
class Pairs:
    """The candidates' and the reference's prompt_stats rows, and `sequences` with, per candidate
    prompt, the row of each side (-1: none)."""

    seq: pl.DataFrame  # parity.sequences (sorted by CAND)
    cand: pl.DataFrame  # every candidate prompt_stats row, sorted by CAND (_CAND_COLUMNS)
    ref: pl.DataFrame  # the reference's rows: PROMPT, first_token_id, logprobs
    cand_row: np.ndarray  # per seq row
    ref_row: np.ndarray

    @classmethod
    def load(cls, requests: pl.DataFrame, stats: pl.LazyFrame, reference: str) -> Pairs:
        seq = parity.sequences(requests, reference)
        is_ref = pl.col("target") == reference
        cand = stats.filter(~is_ref).select(*CAND, *_CAND_COLUMNS).sort(CAND).collect()
        ref = stats.filter(is_ref).select(*PROMPT, "first_token_id", "logprobs").collect()
        rows = (
            seq.select(CAND)
            .join(cand.select(CAND).with_row_index("_c"), on=CAND, how="left", maintain_order="left")
            .join(ref.select(PROMPT).with_row_index("_r"), on=PROMPT, how="left", maintain_order="left")
        )
        to_row = pl.col("_c", "_r").cast(pl.Int64).fill_null(-1)
        cand_row, ref_row = (rows.select(to_row)[c].to_numpy() for c in ("_c", "_r"))
        return cls(seq, cand, ref, cand_row, ref_row)


def first_step(pairs: Pairs) -> pl.DataFrame:
    """parity.first_step: position 0 of both sides, from each prompt's first entries."""
    cand0 = pairs.cand.lazy().filter(pl.col("first_token_id").is_not_null())
    cand0 = cand0.select(
        *CAND,
        cand_token_id="first_token_id",
        cand_logprob=pl.col("logprobs").list.first().cast(_F64),
        _tf_logprob=pl.col("ref_logprobs").list.first().cast(_F64),
        _tied="first_top1_tied",
    )
    ref0 = pairs.ref.lazy().filter(pl.col("first_token_id").is_not_null())
    ref0 = ref0.select(*PROMPT, ref_token_id="first_token_id", ref_logprob=pl.col("logprobs").list.first().cast(_F64))
    return parity.first_step_of(cand0, ref0)


def parity_table(pairs: Pairs, first: pl.DataFrame) -> pl.DataFrame:
    """parity.parity: one row per (model, candidate)."""
    cand = pairs.cand.lazy()
    scored = pl.col("top1_scored").sum()
    kl_n = pl.col("kl_positions").sum()
    sums = cand.group_by(RUN).agg(
        tf_top1_agreement=pl.when(scored > 0).then(pl.col("top1_agreed").sum() / scored),
        kl_topk_mean=pl.when(pl.col("kl_nan").any()).then(None).when(kl_n > 0).then(pl.col("kl_sum").sum() / kl_n),
    )
    diff = pl.col("tf_diff")
    tf_diff_agg = (
        _tf_diffs(pairs)
        .lazy()
        .group_by(RUN)
        .agg(tf_max_abs_logprob_diff=no_nan(diff, diff.max()), tf_mean_abs_logprob_diff=no_nan(diff, diff.mean()))
    )
    return parity.assemble(
        parity.sequence_figures(pairs.seq.lazy()),
        parity.first_figures(first),
        parity.prefix_figures(_prefix(pairs).lazy()),
        sums.join(tf_diff_agg, on=RUN, how="left"),
    )


def _prefix(pairs: Pairs) -> pl.DataFrame:
    """(model, target, _cand_lp, _ref_lp) at every position of the common prefix, as parity's join gives."""
    cand_values, cand_at, cand_n = _flat_arrow(pairs.cand["logprobs"].to_arrow())
    ref_values, ref_at, ref_n = _flat_arrow(pairs.ref["logprobs"].to_arrow())
    has = (pairs.cand_row >= 0) & (pairs.ref_row >= 0)
    c, r = np.where(has, pairs.cand_row, 0), np.where(has, pairs.ref_row, 0)
    first = pairs.seq["first_divergence"].fill_null(np.iinfo(np.int64).max).to_numpy()
    n = np.where(has, np.minimum(np.minimum(cand_n[c], ref_n[r]), first), 0)
    row, position = aligned.common(n)
    return pairs.seq.select(RUN)[row].with_columns(
        _cand_lp=pl.Series(pc.take(cand_values, cand_at[c[row]] + position)).cast(_F64),
        _ref_lp=pl.Series(pc.take(ref_values, ref_at[r[row]] + position)).cast(_F64),
    )


def _flat_arrow(lists: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """(values as Arrow, nulls kept; start of each row's list; its length)."""
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    n = aligned.lengths(lists)
    starts = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64) if len(n) else n
    return pc.list_flatten(lists), starts, n


def _tf_diffs(pairs: Pairs) -> pl.DataFrame:
    """Every candidate position: model, target, prompt (0-based, key order within the candidate),
    tf_diff = |logprob - ref_logprob| (null: unscored), twin_diff = |twin - ref_logprob|."""
    cand = pairs.cand
    n = aligned.lengths(cand["logprobs"].to_arrow())
    row, _ = aligned.common(n)
    ranks = cand.select(prompt=pl.int_range(pl.len()).over(RUN))["prompt"].to_numpy()

    def flat(column: str) -> pl.Series:
        return pl.Series(pc.list_flatten(cand[column].to_arrow())).cast(_F64)

    ref = flat("ref_logprobs")
    return cand.select(RUN)[row].with_columns(
        prompt=pl.Series(ranks[row], dtype=pl.Int64),
        tf_diff=(flat("logprobs") - ref).abs(),
        twin_diff=(flat("twin_logprobs") - ref).abs(),
    )


def noise(pairs: Pairs, spec: NoiseSpec) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(noise_model.summary, divergence.noise): the noise model and each candidate's own TF p99."""
    diffs = _tf_diffs(pairs).filter(pl.col("tf_diff").is_not_null()).rename({"tf_diff": "cand_diff"})
    table = noise_model.of_diffs(diffs, spec)
    diff = pl.col("cand_diff")
    own = diffs.group_by(RUN).agg(
        tf_p99_abs_logprob_diff=no_nan(diff, diff.quantile(divergence.NOISE_QUANTILE, interpolation="linear"))
    )
    return table, own.sort(RUN)


def divergences(
    pairs: Pairs, requests: pl.DataFrame, stats: pl.LazyFrame, reference: str, spec: NoiseSpec, table: pl.DataFrame
) -> pl.DataFrame:
    """divergence.divergences: each candidate prompt's first divergence, classified from its lists."""
    seq = pairs.seq.lazy().select(*CAND, "first_divergence")
    d = pl.col("first_divergence")
    ref_ids = requests.lazy().filter(pl.col("target") == reference).select(*PROMPT, _ref_ids="output_token_ids")
    cand_ids = requests.lazy().select(*CAND, _cand_ids="output_token_ids")
    at_d = (
        stats.filter(pl.col("target") != reference)
        .join(seq.filter(d.is_not_null()), on=CAND, how="inner")
        .select(
            *CAND,
            _row=d < pl.col("n_positions"),  # a token row at the divergence (none past the candidate's end)
            _ref_lp=pl.col("ref_logprobs").list.get(d, null_on_oob=True),
            _ref_top1_lp=pl.col("ref_top1_logprobs").list.get(d, null_on_oob=True),
            cand_in_ref_topk=pl.col("in_ref_topk").list.get(d, null_on_oob=True),
            _cand_topk=pl.col("topk_ids").list.get(d, null_on_oob=True),
        )
    )
    return divergence.classify(
        seq.join(at_d, on=CAND, how="left")
        .join(cand_ids, on=CAND, how="left")
        .join(ref_ids, on=PROMPT, how="left")
        .join(divergence.thresholds(seq, spec, table), on=RUN, how="left")
        .with_columns(
            cand_token=pl.when(pl.col("_row")).then(pl.col("_cand_ids").list.get(d, null_on_oob=True)),
            ref_token=pl.col("_ref_ids").list.get(d, null_on_oob=True),
        )
        .with_columns(ref_in_cand_topk=pl.col("_cand_topk").list.contains(pl.col("ref_token")))
    )


def summary_of(per_prompt: pl.DataFrame, own: pl.DataFrame, table: pl.DataFrame) -> pl.DataFrame:
    """divergence.summary_of, its TF p99 and noise model already computed."""
    return divergence.summary_of(per_prompt, pl.DataFrame(), "", noise_table=table, own=own)
