"""Parity metrics over one run's result tables (Polars only: no torch, no engine).

A run holds, per model, several targets' greedy generations of the same prompts. One target is
the *reference* (the float32 HF run); every other target is a *candidate* compared against it on
the same (model, prompt_set, prompt_id). There are two kinds of comparison:

* Free-running: each target continues from its own output, so once two sequences diverge their
  contexts differ and later positions compare distributions over different prefixes.
  `first_step` (position 0: the context is the prompt for both), `sequences` (exact match,
  token-by-position match, first divergence) and the logprob Pearson r / MAE over the common
  prefix are of this kind.
* Teacher-forced: the reference re-scored every candidate token given the candidate's own prefix
  (the `ref_*` columns on candidate token rows; null on the reference's rows). The context is
  the same at every position, so these metrics (`tf_*` in `parity`, `kl_topk`) measure numerical
  drift without the noise that one early divergence adds to everything after it.

The free-running metrics follow the adaptation reports' accuracy sections (first-step top-1
agreement, logprob difference, probability relative error |P_cand - P_ref| / P_ref, sequence
exact-match rate, token-by-position match rate such as 97/120, Pearson r and MAE of logprobs on
matched tokens). `parity` condenses everything to one row per (model, candidate target). Every
function takes DataFrames or LazyFrames with the columns of fleet/contracts/schema.py and returns a DataFrame;
logprobs are float32 on disk and are widened to float64 before any arithmetic. A run's
throughput and its task accuracy are in fleet/analysis/throughput.py and task_accuracy.py.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from fleet.analysis import aligned, ties
from fleet.analysis.missing import no_nan
from fleet.contracts.errors import UserError
from fleet.results import prompt_stats

Frame = pl.DataFrame | pl.LazyFrame

PROMPT = ["model", "prompt_set", "prompt_id"]  # identifies a prompt within a model
CAND = ["model", "target", "prompt_set", "prompt_id"]  # ... and the candidate answering it
RUN = ["model", "target"]
_F64 = pl.Float64


def split(frame: Frame, reference: str) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(reference rows, candidate rows); a misspelt reference would otherwise give empty results."""
    lazy = frame.lazy()
    targets = lazy.select(pl.col("target").unique()).collect().to_series().to_list()
    if targets and reference not in targets:
        # A misspelt reference, or a run whose reference rows are missing (it failed, or its files
        # were lost): nothing can be compared, and that is the run's state, not a crash.
        msg = f"reference target {reference!r} has no rows among targets {sorted(targets)[:10]}; "
        msg += "parity needs the reference's results (did it fail, or are its files missing?)"
        raise UserError(msg)
    is_ref = pl.col("target") == reference
    return lazy.filter(is_ref), lazy.filter(~is_ref)


def first_step(tokens: Frame, reference: str) -> pl.DataFrame:
    """Per candidate prompt at position 0: logprob_diff = |cand_lp - ref_lp|, rel_err = |p_cand - p_ref| / p_ref.

    cand_lp = cand_logprob; ref_lp = ref_logprob_of_cand (see below); p = exp(logprob).
    Output: model, target, prompt_set, prompt_id, cand_token_id, cand_logprob, ref_token_id,
    ref_logprob (the reference's own first token and its logprob), top1_match, ref_logprob_of_cand,
    logprob_diff, p_ref, p_cand, rel_err. Prompts without a position-0 row on either side are left out.
    top1_match is tie-aware (fleet/analysis/ties.py): a different token that ties the reference's
    top-1 (teacher-forced, same prompt) matches.
    """
    ref, cand = split(tokens, reference)
    at0 = pl.col("position") == 0
    ref0 = ref.filter(at0).select(*PROMPT, ref_token_id="token_id", ref_logprob=pl.col("logprob").cast(_F64))
    cand0 = cand.filter(at0)
    cand0 = cand0.select(
        *CAND,
        cand_token_id="token_id",
        cand_logprob=pl.col("logprob").cast(_F64),
        _tf_logprob=pl.col("ref_logprob").cast(_F64),
        _tied=ties.top1_agreement(ties.longest_topk(cand0)),
    )
    return first_step_of(cand0, ref0)


def first_step_of(cand0: pl.LazyFrame, ref0: pl.LazyFrame) -> pl.DataFrame:
    """`first_step` from position 0 of each side: cand0 (CAND, cand_token_id, cand_logprob, _tf_logprob,
    _tied) and ref0 (PROMPT, ref_token_id, ref_logprob), token rows or prompt_stats alike."""
    return first_step_figures(cand0.join(ref0, on=PROMPT, how="inner")).sort(CAND).collect()


def first_step_figures(paired: pl.LazyFrame) -> pl.LazyFrame:
    """`first_step`'s figures of position 0 pairs: cand0's columns, then ref0's but PROMPT."""
    same = pl.col("cand_token_id") == pl.col("ref_token_id")
    # Same token: the reference's own logprob. Different token: the reference's (teacher-forced)
    # logprob of the candidate's token, so p_ref and p_cand always describe the same event.
    ref_of_cand = pl.when(same).then(pl.col("ref_logprob")).otherwise(pl.col("_tf_logprob"))
    return (
        paired.with_columns(top1_match=same | pl.col("_tied").fill_null(False), ref_logprob_of_cand=ref_of_cand)
        .with_columns(
            logprob_diff=(pl.col("cand_logprob") - pl.col("ref_logprob_of_cand")).abs(),
            p_ref=pl.col("ref_logprob_of_cand").exp(),
            p_cand=pl.col("cand_logprob").exp(),
        )
        .with_columns(rel_err=(pl.col("p_cand") - pl.col("p_ref")).abs() / pl.col("p_ref"))
        .drop("_tf_logprob", "_tied")
    )


def sequences(requests: Frame, reference: str) -> pl.DataFrame:
    """Per candidate prompt: tokens_matched = #{i : cand[i] == ref[i]}, first_divergence = min{i : cand[i] != ref[i]}.

    Positions past the shorter output count as mismatches, so tokens_total = max(n_ref, n_cand)
    and a prefix ends at the shorter length; first_divergence is null iff exact_match.
    Output: model, target, prompt_set, prompt_id, n_ref, n_cand, exact_match, tokens_matched,
    tokens_total, first_divergence.
    """
    ref, cand = split(requests, reference)
    # A null output (failed request) counts as an empty one: it then matches nothing.
    pairs = (
        cand.select(*CAND, _cand="output_token_ids")
        .join(ref.select(*PROMPT, _ref="output_token_ids"), on=PROMPT, how="inner")
        .sort(CAND)
        .collect()
    )
    return sequences_of(pairs.select(CAND), aligned.compare(pairs["_cand"], pairs["_ref"]))


def sequences_of(keys: pl.DataFrame, out: dict[str, np.ndarray]) -> pl.DataFrame:
    """`sequences`' columns for prompts `keys`, from aligned.compare of their outputs."""
    first = out["first_divergence"]
    return keys.with_columns(
        n_ref=pl.Series(out["n_ref"], dtype=pl.UInt32),
        n_cand=pl.Series(out["n_cand"], dtype=pl.UInt32),
        exact_match=pl.Series(first < 0),
        tokens_matched=pl.Series(out["tokens_matched"], dtype=pl.Int64),
        tokens_total=pl.Series(np.maximum(out["n_ref"], out["n_cand"]), dtype=pl.UInt32),
        first_divergence=pl.Series(np.where(first < 0, 0, first), dtype=pl.Int64).set(pl.Series(first < 0), None),
    )


def kl_topk(tokens: Frame, reference: str) -> pl.DataFrame:
    """Per scored candidate position: kl = sum_{i in S} p_r log(p_r / p_c) + tail_r log(tail_r / tail_c), S = ref top-k.

    p_r(i) = exp(ref_topk_logprobs); p_c(i) = exp of the candidate's topk_logprobs entry for i, or,
    when i is outside the candidate's top-k, exp(min(topk_logprobs)) (an upper bound on it);
    tail_x = max(1 - sum_S p_x, 1e-12). This is the KL between the two distributions coarse-grained
    to |S| + 1 outcomes, so by the data-processing inequality it is a lower bound of the true
    KL(ref || cand) when every p_c(i) is exact; with upper-bounded p_c it is an estimate only.
    Both distributions are at the candidate's prefix (teacher-forced), so divergence does not leak in.
    Output: model, target, prompt_set, prompt_id, position, kl.
    """
    _, cand = split(tokens, reference)
    keys = [*CAND, "position"]
    # Unscored (null ref_topk) and empty-top-k rows have no distribution to compare: null > 0 drops them.
    scored = cand.filter(prompt_stats.both_topk()).select(
        *keys, "topk_ids", "topk_logprobs", "ref_topk_ids", "ref_topk_logprobs"
    )
    k = scored.select(pl.max_horizontal(pl.col("ref_topk_ids", "topk_ids").list.len().max())).collect().item() or 0
    kl = prompt_stats.kl(k)  # one definition with the writer's prompt_stats
    return scored.select(*keys, kl=kl).sort(keys).collect()


def parity(requests: Frame, tokens: Frame, reference: str) -> pl.DataFrame:
    """One row per (model, candidate target): first_step/sequences means, prefix r/MAE, teacher-forced drift, KL.

    pearson_r and mae compare cand vs ref logprobs on "matched tokens", taken as the common prefix
    (positions < first_divergence, all positions if identical): only there are both the token and
    its context the same, so the two logprobs score the same event. A later position that happens
    to hold the same token has a different context and would mix divergence into the numbers.
    pearson_r is null for fewer than two tokens or zero variance. tf_* use every scored candidate
    position: tf_top1_agreement = share of positions whose token ties the reference's top-1 (tie-aware,
    fleet/analysis/ties.py), tf_*_abs_logprob_diff over |logprob - ref_logprob|. A NaN among a figure's
    rows makes it null (fleet/analysis/missing.py). first_divergence_mean is over diverged prompts only (null if none);
    kl_topk_mean is the mean of kl_topk's kl. Rates are fractions in [0, 1].
    """
    seq = sequences(requests, reference).lazy()
    ref_tok, cand_tok = split(tokens, reference)
    seq_agg = sequence_figures(seq)
    first_agg = first_figures(first_step(tokens, reference))
    divergence = pl.col("first_divergence")
    prefix_agg = prefix_figures(
        cand_tok.select(*CAND, "position", _cand_lp=pl.col("logprob").cast(_F64))
        .join(ref_tok.select(*PROMPT, "position", _ref_lp=pl.col("logprob").cast(_F64)), on=[*PROMPT, "position"])
        .join(seq.select(*CAND, "first_divergence"), on=CAND)
        .filter(divergence.is_null() | (pl.col("position") < divergence))
    )
    tf_diff = (pl.col("logprob").cast(_F64) - pl.col("ref_logprob").cast(_F64)).abs()
    tf_agg = cand_tok.group_by(RUN).agg(
        tf_top1_agreement=ties.top1_agreement(ties.longest_topk(cand_tok)).mean(),
        tf_max_abs_logprob_diff=no_nan(tf_diff, tf_diff.max()),  # max alone would skip a NaN
        tf_mean_abs_logprob_diff=no_nan(tf_diff, tf_diff.mean()),
    )
    kl = pl.col("kl")
    kl_agg = kl_topk(tokens, reference).lazy().group_by(RUN).agg(kl_topk_mean=no_nan(kl, kl.mean()))
    return assemble(seq_agg, first_agg, prefix_agg, tf_agg, kl_agg)


def assemble(seq_agg: pl.LazyFrame, *parts: pl.LazyFrame) -> pl.DataFrame:
    """`parity`'s row per candidate from its parts, each keyed by (model, target)."""
    out = seq_agg
    for part in parts:
        out = out.join(part, on=RUN, how="left")
    return out.select(
        *RUN, "n_prompts",
        "first_top1_agreement", "first_logprob_diff_mean", "first_prob_rel_err_mean",
        "seq_match_rate", "token_match_rate", "tokens_matched", "tokens_total",
        "pearson_r", "mae",
        "tf_top1_agreement", "tf_max_abs_logprob_diff", "tf_mean_abs_logprob_diff",
        "first_divergence_mean", "n_diverged", "kl_topk_mean",
    ).sort(RUN).collect()  # fmt: skip


def sequence_figures(seq: pl.LazyFrame) -> pl.LazyFrame:
    """`parity`'s columns from `sequences`, per (model, target)."""
    matched = pl.col("tokens_matched").sum()
    total = pl.col("tokens_total").sum()
    return seq.group_by(RUN).agg(
        n_prompts=pl.len(),
        seq_match_rate=pl.col("exact_match").mean(),
        token_match_rate=pl.when(total > 0).then(matched / total),
        tokens_matched=matched,
        tokens_total=total,
        n_diverged=pl.col("first_divergence").is_not_null().sum().cast(pl.Int64),
        first_divergence_mean=pl.col("first_divergence").mean(),
    )


def first_figures(first: pl.DataFrame) -> pl.LazyFrame:
    """`parity`'s columns from `first_step`, per (model, target)."""
    return (
        first.lazy()
        .group_by(RUN)
        .agg(
            first_top1_agreement=pl.col("top1_match").mean(),
            first_logprob_diff_mean=no_nan(pl.col("logprob_diff"), pl.col("logprob_diff").mean()),
            first_prob_rel_err_mean=no_nan(pl.col("rel_err"), pl.col("rel_err").mean()),
        )
    )


def prefix_figures(pairs: pl.LazyFrame) -> pl.LazyFrame:
    """pearson_r and mae per (model, target) from common-prefix pairs (_cand_lp, _ref_lp)."""
    return pairs.group_by(RUN).agg(**prefix_expressions())


def prefix_expressions() -> dict[str, pl.Expr]:
    """pearson_r and mae over the common-prefix pairs in columns _cand_lp and _ref_lp."""
    a, b = pl.col("_cand_lp"), pl.col("_ref_lp")
    return {
        "pearson_r": pl.when(pl.len() >= 2).then(pl.corr(a, b)).fill_nan(None),
        "mae": no_nan(a - b, (a - b).abs().mean()),
    }


def correct() -> pl.Expr:
    """Whether a row's `output_text` satisfies its `expected` rule (fleet.contracts.prompts.is_correct)."""
    from fleet.contracts.prompts import is_correct

    return pl.struct("expected", "output_text").map_elements(
        lambda r: is_correct(r["expected"], r["output_text"]), return_dtype=pl.Boolean
    )


def answers(requests: Frame, reference: str) -> pl.DataFrame:
    """Per candidate prompt: the reference's and the candidate's output text side by side, whether
    the token ids match, and (where an answer is expected) whether each is correct."""
    ref, cand = split(requests, reference)
    judge = correct()
    ref_side = ref.select(*PROMPT, ref_text="output_text", _ref_ids="output_token_ids", ref_correct=judge)
    cand_side = cand.select(*CAND, cand_text="output_text", _cand_ids="output_token_ids", cand_correct=judge)
    return (
        cand_side.join(ref_side, on=PROMPT, how="inner")
        .with_columns(match=pl.col("_cand_ids") == pl.col("_ref_ids"))
        .drop("_cand_ids", "_ref_ids")
        .sort(CAND)
        .collect()
    )
