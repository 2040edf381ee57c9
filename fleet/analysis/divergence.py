"""Where a candidate leaves the reference's greedy path, and whether that is a real divergence.

Greedy decoding turns any numerical difference at a near tie into a different token: when the
reference's own top two candidates are 0.01 nats apart, bfloat16 noise of 0.1 nats flips the
choice on one machine and not on the next. A verdict that counts such flips is not stable across
machines. So every first divergence is classified:

* **near tie**: the reference's margin between its own top-1 and the candidate's token (both
  teacher-forced at the candidate's prefix, which up to the divergence is the common prefix) is
  within the candidate's noise, AND the candidate's token is in the reference's top-k AND the
  reference's token is in the candidate's top-k (vLLM's own HF-vs-vLLM test criterion);
* **divergence** otherwise (including an output that simply ends early).

The noise is `near_tie_nats` when the manifest sets it (`parity: {near_tie_nats: ...}`), else the
noise model's (fleet/analysis/noise_model.py): what a correct implementation at the candidate's
precision shows, measured by the precision twin, never the candidate's own error (a candidate
would otherwise excuse its divergences by being wrong everywhere else too).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from fleet.analysis import noise_model
from fleet.analysis.missing import no_nan
from fleet.analysis.noise_model import NoiseSpec
from fleet.analysis.parity import CAND, RUN, Frame, sequences, split

_F64 = pl.Float64
NOISE_QUANTILE = 0.99
COLUMNS = [
    "first_divergence", "cand_token", "ref_token", "ref_margin", "noise",
    "cand_in_ref_topk", "ref_in_cand_topk", "near_tie", "kind",
]  # fmt: skip


def noise(tokens: Frame, reference: str) -> pl.DataFrame:
    """Per (model, candidate): tf_p99_abs_logprob_diff, the p99 of its own |logprob - ref_logprob|
    (a figure of the candidate; the near-tie threshold comes from the noise model)."""
    _, cand = split(tokens, reference)
    diff = (pl.col("logprob").cast(_F64) - pl.col("ref_logprob").cast(_F64)).abs()
    return (
        cand.group_by(RUN)
        .agg(tf_p99_abs_logprob_diff=no_nan(diff, diff.quantile(NOISE_QUANTILE, interpolation="linear")))
        .sort(RUN)
        .collect()
    )


def divergences(
    requests: Frame,
    tokens: Frame,
    reference: str,
    *,
    spec: NoiseSpec | None = None,
    noise_table: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Per candidate prompt: its first divergence (null when the outputs are identical) classified.

    Output: model, target, prompt_set, prompt_id, first_divergence, cand_token, ref_token,
    ref_margin (reference top-1 logprob minus its logprob of the candidate's token, nats),
    noise (the threshold used), cand_in_ref_topk, ref_in_cand_topk, near_tie (null when no
    divergence), kind ("identical" | "near tie" | "divergence").
    """
    ref_req, _ = split(requests, reference)
    seq = sequences(requests, reference).lazy().select(*CAND, "first_divergence")
    ref_ids = ref_req.select("model", "prompt_set", "prompt_id", _ref_ids="output_token_ids")
    at = tokens.lazy().select(
        *CAND,
        first_divergence="position",
        cand_token="token_id",
        _ref_lp="ref_logprob",
        _ref_top1_lp=pl.col("ref_topk_logprobs").list.first(),
        _ref_topk="ref_topk_ids",
        _cand_topk="topk_ids",
    )
    spec = spec or NoiseSpec()
    table = noise_table
    if spec.near_tie_nats is None and table is None:  # noise_table: noise_model.summary, when the caller has it
        table = noise_model.summary(tokens, reference, spec)
    threshold = thresholds(seq, spec, table)
    ref_token = pl.col("_ref_ids").list.get(pl.col("first_divergence"), null_on_oob=True)
    return classify(
        seq.join(at, on=[*CAND, "first_divergence"], how="left")
        .join(ref_ids, on=["model", "prompt_set", "prompt_id"], how="left")
        .join(threshold, on=RUN, how="left")
        .with_columns(ref_token=ref_token)
        .with_columns(
            cand_in_ref_topk=pl.col("_ref_topk").list.contains(pl.col("cand_token")),
            ref_in_cand_topk=pl.col("_cand_topk").list.contains(pl.col("ref_token")),
        )
    )


def classify(at: pl.LazyFrame, *, in_key_order: bool = False) -> pl.DataFrame:
    """`divergences` from each candidate prompt's figures at its first divergence: CAND,
    first_divergence, cand_token, ref_token, _ref_lp, _ref_top1_lp, cand_in_ref_topk,
    ref_in_cand_topk (null: no row there) and noise; sorted by CAND (`in_key_order`: `at` is)."""
    margin = (pl.col("_ref_top1_lp").cast(_F64) - pl.col("_ref_lp").cast(_F64)).clip(lower_bound=0.0)
    diverged = pl.col("first_divergence").is_not_null()
    near = (
        pl.col("ref_margin").is_not_null()
        & (pl.col("ref_margin") <= pl.col("noise"))
        & pl.col("cand_in_ref_topk")
        & pl.col("ref_in_cand_topk")
    ).fill_null(False)
    return (
        at.with_columns(
            ref_margin=margin,
            cand_in_ref_topk=pl.col("cand_in_ref_topk").fill_null(False),
            ref_in_cand_topk=pl.col("ref_in_cand_topk").fill_null(False),
        )
        .with_columns(near_tie=pl.when(diverged).then(near))
        .with_columns(
            kind=pl.when(~diverged)
            .then(pl.lit("identical"))
            .when(pl.col("near_tie"))
            .then(pl.lit("near tie"))
            .otherwise(pl.lit("divergence"))
        )
        .select(*CAND, *COLUMNS)
        .pipe(lambda frame: frame if in_key_order else frame.sort(CAND))
        .collect()
    )


def thresholds(seq: pl.LazyFrame, spec: NoiseSpec, noise_table: pl.DataFrame | None) -> pl.LazyFrame:
    """The near-tie threshold per (model, candidate): the manifest's near_tie_nats, else the noise model's."""
    if spec.near_tie_nats is None and noise_table is not None:
        return noise_table.lazy().select(*RUN, "noise")
    return seq.select(*RUN).unique().with_columns(noise=pl.lit(spec.near_tie_nats, dtype=_F64))


def summary(requests: Frame, tokens: Frame, reference: str, *, spec: NoiseSpec | None = None) -> pl.DataFrame:
    """Per (model, candidate): near_ties, real_divergences, first_top1_agreement_excl_ties (a
    first-token flip that is a near tie counts as agreement), seq_match_rate_excl_ties, the
    candidate's own tf_p99_abs_logprob_diff, and the noise model's columns."""
    table = noise_model.summary(tokens, reference, spec)  # one bootstrap for both
    per_prompt = divergences(requests, tokens, reference, spec=spec, noise_table=table)
    return summary_of(per_prompt, tokens, reference, noise_table=table)


def summary_of(
    per_prompt: Frame,
    tokens: Frame,
    reference: str,
    *,
    spec: NoiseSpec | None = None,
    noise_table: pl.DataFrame | None = None,
    own: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """`summary` from divergences already computed (a report needs both; each costs a pass);
    `own`: `noise` (the candidates' TF p99), when the caller has it."""
    tie = pl.col("kind") == "near tie"
    first_ok = pl.col("first_divergence").is_null() | (pl.col("first_divergence") > 0) | tie
    return (
        per_prompt.lazy()
        .group_by(RUN)
        .agg(
            near_ties=tie.sum().cast(pl.Int64),
            real_divergences=(pl.col("kind") == "divergence").sum().cast(pl.Int64),
            first_top1_agreement_excl_ties=first_ok.mean(),
            seq_match_rate_excl_ties=(pl.col("kind") != "divergence").mean(),
        )
        .join((noise(tokens, reference) if own is None else own).lazy(), on=RUN, how="left")
        .join(
            (noise_model.summary(tokens, reference, spec) if noise_table is None else noise_table).lazy(),
            on=RUN,
            how="left",
        )
        .sort(RUN)
        .collect()
    )


def worst(seqs: pl.DataFrame, per_prompt: pl.DataFrame, top: int) -> pl.DataFrame:
    """Of `seqs` (one row per candidate prompt, in key order), the `top` worst per candidate: real divergences,
    then near ties, earliest first, then the fewest matched tokens; with their kind and margin."""
    extra = ["kind", "ref_margin", "noise"]
    if seqs.select(CAND).equals(per_prompt.select(CAND)):  # the report's: the same prompts in the same order
        joined = seqs.hstack(per_prompt.select(extra))
    else:
        joined = seqs.join(per_prompt.select(*CAND, *extra), on=CAND, how="left", maintain_order="left")
    # `seqs` is in key order (parity.sequences sorts it): each candidate's rows lie together, and
    # among ties the earlier row is the earlier key, so the `top` rows of a candidate are its `top`
    # smallest (kind, first_divergence, tokens_matched), ties to the earlier row: found by
    # partitioning one number per row, not by sorting every row (0.9 s at 100M token rows).
    kinds = {"divergence": 0, "near tie": 1}
    kind = pl.col("kind").replace_strict(kinds, default=2, return_dtype=pl.Int64).fill_null(3)  # null: last
    numbers = joined.select(
        kind, pl.col("first_divergence", "tokens_matched").cast(pl.Int64), _candidate=pl.struct(RUN).rle_id()
    )
    fits = numbers.select(pl.col("first_divergence", "tokens_matched").is_between(0, _UNSET - 1).all()).row(0)
    if not all(fits):  # a figure past the packing: sort as the rule says
        ranked = joined.with_columns(_candidate=numbers["_candidate"]).sort(
            "_candidate", numbers["kind"], "first_divergence", "tokens_matched", nulls_last=True, maintain_order=True
        )
        return ranked.group_by("_candidate", maintain_order=True).head(top).drop("_candidate").sort(CAND)
    packed = numbers.select(
        (pl.col("kind") * (1 << 2 * _BITS))
        + pl.col("first_divergence").fill_null(_UNSET) * (1 << _BITS)
        + pl.col("tokens_matched").fill_null(_UNSET)
    ).to_series()
    starts = np.flatnonzero(np.diff(numbers["_candidate"].to_numpy(), prepend=-1))
    return joined[smallest_per_block(packed.to_numpy(), starts, top)].sort(CAND)


_BITS = 29  # per packed figure: positions and token counts below 2^29 - 1 (2^29 - 1: null, last)
_UNSET = (1 << _BITS) - 1


def smallest_per_block(score: np.ndarray, starts: np.ndarray, top: int) -> np.ndarray:
    """Rows of the `top` smallest scores of each block (rows starts[i] .. starts[i+1] - 1), ties to
    the earlier row, in row order: what a stable sort on the score and the first `top` of each
    block pick."""
    if top <= 0 or not len(score):
        return np.zeros(0, dtype=np.int64)
    ends = np.append(starts[1:], len(score)).astype(np.int64)
    picked = []
    for first, end in zip(starts.tolist(), ends.tolist(), strict=True):
        block = score[first:end]
        if len(block) <= top:
            picked.append(np.arange(first, end, dtype=np.int64))
            continue
        kth = np.partition(block, top - 1)[top - 1]
        below = np.flatnonzero(block < kth)
        tied = np.flatnonzero(block == kth)[: top - len(below)]
        picked.append(first + np.sort(np.concatenate([below, tied])))
    return np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)
