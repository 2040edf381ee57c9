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

_F64 = pl.Float64
# Keeps log(tail) finite when the top-k holds all the mass (or upper-bounded p_c sum past 1).
# float32 logprobs leave ~1e-7 of noise in 1 - sum(p), so tails that small mean "none" anyway.
TAIL_FLOOR = 1e-12
PROMPT = ["model", "model_weights", "target", "prompt_set", "prompt_id"]
# The values at a prompt's top1_split (fleet/results/prompt_rows.py), each from its per-position list.
SPLIT = {
    "split_ref_top1_logprob": "ref_top1_logprobs",
    "split_in_ref_topk": "in_ref_topk",
    "split_ref_top1_id": "ref_top1_ids",
    "split_ref_top1_in_topk": "ref_top1_in_topk",
}


def topk_slots(k: int) -> dict[str, pl.Expr]:
    """What `top1_agreement` and `kl` compare, one column per top-k slot: a caller over many rows
    adds these columns first (`with_columns`) and passes `materialized=True`, so that each list is
    read once per slot rather than once per comparison (summarize: 4x faster)."""
    lp, ref_lp = pl.col("topk_logprobs"), pl.col("ref_topk_logprobs")
    slots = {
        "_cand_max": pl.max_horizontal(pl.col("logprob"), lp.list.max()),  # its token is its greedy choice
        "_ref_max": ref_lp.list.max(),
        "_scored": ref_lp.list.len() > 0,
    }
    for j in range(k):
        slots[f"_cand_id{j}"] = pl.col("topk_ids").list.get(j, null_on_oob=True).cast(pl.Int64)
        slots[f"_cand_lp{j}"] = lp.list.get(j, null_on_oob=True)
        slots[f"_ref_id{j}"] = pl.col("ref_topk_ids").list.get(j, null_on_oob=True).cast(pl.Int64)
        slots[f"_ref_lp{j}"] = ref_lp.list.get(j, null_on_oob=True)
    return slots


def top1_agreement(k: int, *, materialized: bool = False) -> pl.Expr:
    """On candidate token rows (teacher-forced columns alongside): whether the candidate's token, or
    any of its tied maxima, is among the reference's tied maxima at the same prefix. `k` is at least
    the longest top-k list. Null where the row was not scored (fleet/analysis/ties.py: the rule).
    `materialized`: the `topk_slots` columns are there already."""
    s = {name: pl.col(name) if materialized else e for name, e in topk_slots(k).items()}
    token = pl.col("token_id").cast(pl.Int64)
    # Each side's tied maxima, a slot null where it is not one; the candidate's own token always is.
    cand = [token, *(pl.when(s[f"_cand_lp{j}"] >= s["_cand_max"]).then(s[f"_cand_id{j}"]) for j in range(k))]
    ref = [
        pl.when(pl.col("ref_logprob") >= s["_ref_max"]).then(token),  # the reference's logprob of the token
        *(pl.when(s[f"_ref_lp{j}"] >= s["_ref_max"]).then(s[f"_ref_id{j}"]) for j in range(k)),
    ]
    # The two sets meet: some pair is equal ((k+1)^2 column comparisons, no list built).
    meet = pl.any_horizontal(*((c == r).fill_null(False) for c in cand for r in ref))
    return pl.when(s["_scored"]).then(meet)


def longest_topk(tokens: pl.LazyFrame) -> int:
    """The longest top-k list of either side: how many slots `top1_agreement` and `kl` look at."""
    width = pl.max_horizontal(pl.col("topk_ids", "ref_topk_ids").list.len().max())
    return int(tokens.select(width).collect().item() or 0)


def both_topk() -> pl.Expr:
    """Rows with a distribution on both sides; unscored (null) and empty top-k rows have none."""
    return (pl.col("ref_topk_ids").list.len() > 0) & (pl.col("topk_ids").list.len() > 0)


def kl(k: int, *, materialized: bool = False) -> pl.Expr:
    """KL top-k of one row (fleet/analysis/parity.py `kl_topk` defines it); meaningful where `both_topk`.
    `materialized`: the `topk_slots` columns are there already.

    Column-wise over list slots (k x k comparisons, k <= 20), not exploded rows and a join."""
    s = {name: pl.col(name) if materialized else e for name, e in topk_slots(k).items()}
    lc_min = pl.col("topk_logprobs").list.min().cast(_F64)
    head, sum_pr, sum_pc = pl.lit(0.0), pl.lit(0.0), pl.lit(0.0)
    for j in range(k):
        rid, lr = s[f"_ref_id{j}"], s[f"_ref_lp{j}"].cast(_F64)
        found = [pl.when(s[f"_cand_id{m}"] == rid).then(s[f"_cand_lp{m}"]) for m in range(k)]
        lc = pl.coalesce(*found, lc_min).cast(_F64)
        present = rid.is_not_null()
        head = head + pl.when(present).then(lr.exp() * (lr - lc)).otherwise(0.0)
        sum_pr = sum_pr + pl.when(present).then(lr.exp()).otherwise(0.0)
        sum_pc = sum_pc + pl.when(present).then(lc.exp()).otherwise(0.0)
    tail_r = (1 - sum_pr).clip(lower_bound=TAIL_FLOOR)
    tail_c = (1 - sum_pc).clip(lower_bound=TAIL_FLOOR)
    return head + tail_r * (tail_r / tail_c).log()
