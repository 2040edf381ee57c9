"""A shard's prompt_stats rows, computed from its token rows when they are written.

The report's figures compare a candidate's prompt with the reference's (first divergence, the
common prefix, the token at the divergence), and which positions matter is known only once both
targets ran. Joining token rows for that is what made a report of a big run slow: tens of millions
of rows joined on four string keys. So each shard also stores, per prompt, the few token columns
those comparisons read as lists indexed by position, and the sums the per-candidate figures merge
(tie-aware top-1 agreement, KL top-k). The report joins prompts, not tokens
(fleet/analysis/from_stats.py). The per-row expressions live here, below fleet.analysis, so the
writer and the exact path (fleet/analysis/ties.py, parity.py) compute them with one definition.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from fleet.contracts import schema

_F64 = pl.Float64
# Keeps log(tail) finite when the top-k holds all the mass (or upper-bounded p_c sum past 1).
# float32 logprobs leave ~1e-7 of noise in 1 - sum(p), so tails that small mean "none" anyway.
TAIL_FLOOR = 1e-12
PROMPT = ["model", "model_weights", "target", "prompt_set", "prompt_id"]


def top1_agreement(k: int) -> pl.Expr:
    """On candidate token rows (teacher-forced columns alongside): whether the candidate's token, or
    any of its tied maxima, is among the reference's tied maxima at the same prefix. `k` is at least
    the longest top-k list. Null where the row was not scored (fleet/analysis/ties.py: the rule)."""
    lp, ref_lp = pl.col("topk_logprobs"), pl.col("ref_topk_logprobs")
    cand_max = pl.max_horizontal(pl.col("logprob"), lp.list.max())
    ref_max = ref_lp.list.max()

    def tied(ids: str, logprobs: pl.Expr, top: pl.Expr) -> list[pl.Expr]:
        return [
            pl.when(logprobs.list.get(j, null_on_oob=True) >= top).then(
                pl.col(ids).list.get(j, null_on_oob=True).cast(pl.Int64)
            )
            for j in range(k)
        ]

    # The candidate's own token is its greedy choice; the reference's logprob of it sits in ref_logprob.
    cand_tied = pl.concat_list(pl.col("token_id").cast(pl.Int64), *tied("topk_ids", lp, cand_max)).list.drop_nulls()
    ref_tied = pl.concat_list(
        pl.when(pl.col("ref_logprob") >= ref_max).then(pl.col("token_id").cast(pl.Int64)),
        *tied("ref_topk_ids", ref_lp, ref_max),
    ).list.drop_nulls()
    scored = ref_lp.list.len() > 0
    return pl.when(scored).then(cand_tied.list.set_intersection(ref_tied).list.len() > 0)


def longest_topk(tokens: pl.LazyFrame) -> int:
    """The longest top-k list of either side: how many slots `top1_agreement` and `kl` look at."""
    width = pl.max_horizontal(pl.col("topk_ids", "ref_topk_ids").list.len().max())
    return int(tokens.select(width).collect().item() or 0)


def both_topk() -> pl.Expr:
    """Rows with a distribution on both sides; unscored (null) and empty top-k rows have none."""
    return (pl.col("ref_topk_ids").list.len() > 0) & (pl.col("topk_ids").list.len() > 0)


def kl(k: int) -> pl.Expr:
    """KL top-k of one row (fleet/analysis/parity.py `kl_topk` defines it); meaningful where `both_topk`.

    Column-wise over list slots (k x k comparisons, k <= 20), not exploded rows and a join."""
    lc_min = pl.col("topk_logprobs").list.min().cast(_F64)
    head, sum_pr, sum_pc = pl.lit(0.0), pl.lit(0.0), pl.lit(0.0)
    for j in range(k):
        rid = pl.col("ref_topk_ids").list.get(j, null_on_oob=True)
        lr = pl.col("ref_topk_logprobs").list.get(j, null_on_oob=True).cast(_F64)
        found = [
            pl.when(pl.col("topk_ids").list.get(m, null_on_oob=True) == rid).then(
                pl.col("topk_logprobs").list.get(m, null_on_oob=True)
            )
            for m in range(k)
        ]
        lc = pl.coalesce(*found, lc_min).cast(_F64)
        present = rid.is_not_null()
        head = head + pl.when(present).then(lr.exp() * (lr - lc)).otherwise(0.0)
        sum_pr = sum_pr + pl.when(present).then(lr.exp()).otherwise(0.0)
        sum_pc = sum_pc + pl.when(present).then(lc.exp()).otherwise(0.0)
    tail_r = (1 - sum_pr).clip(lower_bound=TAIL_FLOOR)
    tail_c = (1 - sum_pc).clip(lower_bound=TAIL_FLOOR)
    return head + tail_r * (tail_r / tail_c).log()


def summarize(tokens: pa.Table) -> pa.Table:
    """One prompt_stats row per prompt of a shard's token rows (columns: schema.PROMPT_STATS)."""
    frame = pl.from_arrow(schema.conform(tokens, schema.TOKENS))  # a column the engine left out is null
    assert isinstance(frame, pl.DataFrame)  # a Table always converts to a DataFrame
    lazy = frame.lazy()
    k = longest_topk(lazy)
    at0 = pl.col("position") == 0
    kl_row = pl.when(both_topk()).then(kl(k))
    rows = (
        lazy.sort(*PROMPT, "position")
        .with_columns(_tied=top1_agreement(k), _kl=kl_row)
        .group_by(PROMPT, maintain_order=True)
        .agg(
            n_positions=pl.len().cast(pl.Int32),
            contiguous=(pl.col("position") == pl.int_range(pl.len())).all(),
            first_token_id=pl.col("token_id").filter(at0).first(),
            first_top1_tied=pl.col("_tied").filter(at0).first(),
            logprobs="logprob",
            ref_logprobs="ref_logprob",
            twin_logprobs="twin_logprob",
            ref_top1_logprobs=pl.col("ref_topk_logprobs").list.first(),
            in_ref_topk=pl.col("ref_topk_ids").list.contains(pl.col("token_id")).fill_null(False),
            topk_ids="topk_ids",
            # What the report's near-tie rule asks of topk_ids at a divergence, where the reference's
            # output is its teacher-forced top-1 (nearly always): two flat lists, not the list of lists.
            ref_top1_ids=pl.col("ref_topk_ids").list.first(),
            ref_top1_in_topk=pl.col("topk_ids").list.contains(pl.col("ref_topk_ids").list.first()),
            top1_scored=pl.col("_tied").is_not_null().sum().cast(pl.Int32),
            top1_agreed=pl.col("_tied").sum().cast(pl.Int32),
            kl_positions=pl.col("_kl").is_not_null().sum().cast(pl.Int32),
            kl_sum=pl.col("_kl").sum(),
            kl_nan=pl.col("_kl").is_nan().any(),
        )
        .collect()
    )
    return schema.conform(rows.to_arrow(), schema.PROMPT_STATS)
