"""A shard's prompt_stats rows from its token rows, without sorting or hashing the token rows.

One prompt_stats row per prompt (columns: schema.PROMPT_STATS): the rows a sort of the token rows
by prompt and position, then a group-by per prompt, would give, with the per-row figures of
fleet/results/prompt_stats.py. This module computes them fast enough for the driver to write every shard's
(docs/measurements.md, "The driver path at 1M rows/s"). Engines return a shard's token rows
grouped by prompt, positions ascending, so each prompt's rows are one run of consecutive rows:

- the per-row figures (tie-aware top-1 agreement, KL top-k, the reference's top-1) are column-wise
  Polars expressions over the shard, the ones the exact path uses (fleet/results/prompt_stats.py);
- each by-position list of a prompt is its run of a column: the column's values with the runs'
  offsets, no copy (Arrow ListArray);
- each per-prompt count and sum is taken over its run in numpy; kl_sum adds a prompt's values in
  position order, one after the other (what a group-by sum does within one batch of rows);
- the prompts are then put in key order, as a sort of the token rows would have left them.

Rows that are not grouped that way (no engine returns them) are sorted first, then go the same way.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from fleet.contracts import schema
from fleet.results import prompt_stats, prompt_tails, topk_arrays
from fleet.results.prompt_stats import PROMPT, SPLIT

# Per-row columns of the token rows that prompt_stats lists by position, as they are.
TOPK = ["topk_ids", "topk_logprobs", "ref_topk_ids", "ref_topk_logprobs"]
LISTED = {"logprobs": "logprob", "ref_logprobs": "ref_logprob", "twin_logprobs": "twin_logprob", "topk_ids": "topk_ids"}


def summarize(tokens: pa.Table) -> pa.Table:
    """One prompt_stats row per prompt of a shard's token rows (columns: schema.PROMPT_STATS)."""
    tokens = schema.conform(tokens, schema.TOKENS)  # a column the engine left out is null
    if not tokens.num_rows:
        return schema.PROMPT_STATS.empty_table()
    if tokens.column("position").null_count:
        msg = "token rows with a null 'position': the tokens table declares it non-nullable"
        raise ValueError(msg)
    starts = _runs(tokens)
    if starts is None:  # not grouped by prompt: sorted as the prompts and positions go
        frame = pl.from_arrow(tokens)
        assert isinstance(frame, pl.DataFrame)  # a Table always converts to a DataFrame
        order = frame.select(pl.arg_sort_by([*PROMPT, "position"], maintain_order=True)).to_series()
        tokens = tokens.take(order.to_arrow())
        starts = _runs(tokens)
        assert starts is not None  # sorted rows are grouped
    k = max(pc.max(tokens.column(c).combine_chunks().value_lengths()).as_py() or 0 for c in TOPK)
    per_row = topk_arrays.per_row(tokens, k)
    if per_row is None:  # what the arrays cannot say exactly (a NaN, a null inside a list...)
        per_row = _per_row_expressions(tokens, k)
    table = _per_prompt(tokens, per_row, starts)
    # Prompts in key order (a sort's); the keys are unique, so any sort gives this one order
    # (Arrow's: strings by their bytes, as Polars compares them, a null key first as Polars puts it).
    order = pc.sort_indices(table.select(PROMPT), [(name, "ascending", "at_start") for name in PROMPT])
    return schema.conform(table.take(order), schema.PROMPT_STATS)


def _runs(tokens: pa.Table) -> np.ndarray | None:
    """Where each prompt's run of rows starts, if each prompt's rows are one run of consecutive
    rows with positions strictly ascending; else None."""
    n = tokens.num_rows
    new = np.zeros(n, bool)
    new[0] = True
    for name in PROMPT:  # a null key is a key of its own, as a group-by takes it
        column = tokens.column(name).combine_chunks()
        after, before = column.slice(1), column.slice(0, n - 1)
        new[1:] |= np.asarray(pc.not_equal(after, before).fill_null(False))
        if column.null_count:
            new[1:] |= np.asarray(after.is_null()) != np.asarray(before.is_null())
    position = tokens.column("position").to_numpy()
    if not (new[1:] | (np.diff(position) > 0)).all():
        return None
    starts = np.flatnonzero(new)
    firsts = pl.from_arrow(tokens.select(PROMPT).take(pa.array(starts)))
    assert isinstance(firsts, pl.DataFrame)  # a Table always converts to a DataFrame
    return None if firsts.is_duplicated().any() else starts  # a prompt in two runs: not grouped


def _per_row_expressions(tokens: pa.Table, k: int) -> dict[str, pa.Array]:
    """`topk_arrays.per_row`'s columns from prompt_stats' Polars expressions, which define them."""
    lazy = pl.from_arrow(tokens).lazy()  # type: ignore[union-attr]
    if tokens.column("ref_topk_ids").null_count == tokens.num_rows:  # nothing scored: a reference's own rows
        lazy = lazy.with_columns(_tied=pl.lit(None, pl.Boolean), _kl=pl.lit(None, pl.Float64))
    else:
        lazy = lazy.with_columns(**prompt_stats.topk_slots(k)).with_columns(
            _tied=prompt_stats.top1_agreement(k, materialized=True),
            _kl=pl.when(prompt_stats.both_topk()).then(prompt_stats.kl(k, materialized=True)),
        )
    ref_top1 = pl.col("ref_topk_ids").list.first()
    rows = lazy.select(
        "_tied",
        "_kl",
        ref_top1_logprobs=pl.col("ref_topk_logprobs").list.first(),
        in_ref_topk=pl.col("ref_topk_ids").list.contains(pl.col("token_id")).fill_null(False),
        ref_top1_ids=ref_top1,
        ref_top1_in_topk=pl.col("topk_ids").list.contains(ref_top1),
    ).collect()
    return {name: rows.get_column(name).to_arrow() for name in rows.columns}


def _per_prompt(tokens: pa.Table, rows: dict[str, pa.Array], starts: np.ndarray) -> pa.Table:
    """The prompt_stats columns of runs starting at `starts` (in row order) of grouped token rows."""
    n = tokens.num_rows
    offsets = np.append(starts, n)
    lengths = np.diff(offsets)
    arrow_offsets = pa.array(offsets.astype(np.int32))

    def listed(values: pa.Array | pa.ChunkedArray) -> pa.ListArray:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        return pa.ListArray.from_arrays(arrow_offsets, values)

    position = tokens.column("position").to_numpy()
    # contiguous: positions 0, 1, 2... of the run
    at_index = position == np.arange(n) - np.repeat(starts, lengths)
    tied, kl = rows["_tied"], rows["_kl"]
    tied_valid, tied_true = np.asarray(tied.is_valid()), np.asarray(tied.fill_null(False))
    kl_valid = np.asarray(kl.is_valid())
    kl_lists = pl.from_arrow(listed(kl))
    assert isinstance(kl_lists, pl.Series)
    # Position 0 of each run (strictly ascending positions: at most one per run; sorted rows: the first).
    first = np.full(len(starts), -1)
    at0 = np.flatnonzero(position == 0)[::-1]  # reversed: the first of a run is assigned last
    first[np.searchsorted(starts, at0, side="right") - 1] = at0
    has0 = first >= 0
    at_first = pa.array(np.where(has0, first, 0))
    columns: dict[str, pa.Array] = {name: tokens.column(name).take(pa.array(starts)) for name in PROMPT}
    columns |= {
        "n_positions": pa.array(lengths.astype(np.int32)),
        "contiguous": pa.array(np.logical_and.reduceat(at_index, starts)),
        "first_token_id": _masked(tokens.column("token_id").take(at_first), has0),
        "first_top1_tied": _masked(tied.take(at_first), has0),
    }
    columns |= {name: listed(tokens.column(source)) for name, source in LISTED.items() if name != "topk_ids"}
    columns |= {name: listed(rows[name]) for name in ("ref_top1_logprobs", "in_ref_topk")}
    columns["topk_ids"] = listed(tokens.column("topk_ids"))
    columns |= {name: listed(rows[name]) for name in ("ref_top1_ids", "ref_top1_in_topk")}
    columns |= {
        "top1_scored": pa.array(np.add.reduceat(tied_valid.astype(np.int32), starts).astype(np.int32)),
        "top1_agreed": pa.array(np.add.reduceat((tied_true & tied_valid).astype(np.int32), starts).astype(np.int32)),
        "kl_positions": pa.array(np.add.reduceat(kl_valid.astype(np.int32), starts).astype(np.int32)),
        # Polars' own sum over each prompt's values (a group-by sums a group's values the same way).
        "kl_sum": kl_lists.list.sum().to_arrow(),
        "kl_nan": pa.array(np.logical_or.reduceat(np.isnan(np.asarray(kl.fill_null(0.0))) & kl_valid, starts)),
    }
    columns |= prompt_tails.of_rows(tokens, starts)
    columns["first_ref_logprob"] = _masked(tokens.column("ref_logprob").take(at_first), has0)
    columns |= _at_split(tokens, rows, starts)
    return pa.table(columns)


def _at_split(tokens: pa.Table, rows: dict[str, pa.Array], starts: np.ndarray) -> dict[str, pa.Array]:
    """Each prompt's top1_split (the first position whose token is not the reference's teacher-forced
    top-1, an unscored one included) and the values there that the report's divergence table reads:
    where the reference's own output followed its top-1 up to there, the first divergence is that
    position, and the report reads these instead of every position's lists."""
    n = tokens.num_rows
    token = tokens.column("token_id").combine_chunks()
    same = np.asarray(pc.equal(token.cast(pa.int64()), rows["ref_top1_ids"].cast(pa.int64())).fill_null(False))
    index = np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))
    first = np.minimum.reduceat(np.where(same, n, np.arange(n)), starts)  # n: none in the run
    found = first < np.append(starts[1:], n)
    row = pa.array(np.where(found, first, 0))
    # Positions 0..n-1 (contiguous): the list index is the position; else the report does not use these.
    out = {"top1_split": pa.array(np.where(found, index[np.minimum(first, n - 1)], 0).astype(np.int32), mask=~found)}
    out["split_ref_logprob"] = _masked(tokens.column("ref_logprob").take(row), found)
    for name, listed_as in SPLIT.items():
        out[name] = _masked(rows[listed_as].take(row), found)
    return out


def _masked(values: pa.Array | pa.ChunkedArray, keep: np.ndarray) -> pa.Array:
    """`values` with null where `keep` is False."""
    return pc.if_else(pa.array(keep), values, pa.nulls(len(values), values.type))
