"""Rows of a stored table in blocks, one per (model, target), each target of a model holding its
prompts in the reference's order: how fleet writes them (every target of a model runs the same
shard plan, and the reader lists each target's files in the same order).

Pairing a candidate's prompts with the reference's, putting them in key order, or counting the
reference's prompts a target answered then needs no join, sort or hash of every row's string keys:
each block is compared with its model's first block row for row, and only that block is sorted.
A table that is not in such blocks (a failed shard, a resumed run with files of another plan,
runs of one target interleaved, a prompt twice, a key missing) gets `None`, and the caller joins
and sorts as before. `runs` finds the blocks where the keys change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from fleet.analysis import key_order
from fleet.analysis.parity import PROMPT, RUN


@dataclass(frozen=True)
class Blocks:
    """A table's rows in blocks, one per (model, target), every block of a model holding the same
    prompts in the same order, none twice."""

    runs: pl.DataFrame  # RUN, first, end of each block, in table order
    order: dict[str, np.ndarray]  # per model, the offsets within each of its blocks in key order


def blocks(keys: pl.DataFrame) -> Blocks | None:
    """`keys` (CAND of a table's rows) as Blocks, or None where they are not in such blocks."""
    if any(keys.null_count().row(0)):
        return None  # a key missing: a join on the keys pairs no such row, block by block would
    found = runs(keys)
    if found.select(RUN).n_unique() != found.height:
        return None  # a target's rows in more than one place
    prompts = keys.select(PROMPT[1:])  # within a model's blocks
    order: dict[str, np.ndarray] = {}
    first_block: dict[str, pl.DataFrame] = {}
    for model, _target, first, end in found.iter_rows():
        block = prompts[first:end]
        if model in first_block:
            if not block.equals(first_block[model]):
                return None
            continue
        first_block[model] = block
        in_order = _key_order(block)
        if in_order is None:
            return None  # a prompt twice: a join pairs each copy with each, not row by row
        order[model] = in_order
    return Blocks(found, order)


def _key_order(block: pl.DataFrame) -> np.ndarray | None:
    """The offsets of a block's rows in key order; None where a prompt is there twice. A block in key
    order already (prompt_stats: each shard writes its prompts sorted) is checked, not sorted."""
    order_of = key_order.sorted_order(block, PROMPT[1:])
    if order_of is None:
        return np.arange(block.height, dtype=np.int64)
    order = order_of.to_numpy().astype(np.int64)
    in_order = block[order]
    if in_order.select(pl.all_horizontal(pl.all().eq_missing(pl.all().shift()))).to_series().any():
        return None
    return order


@dataclass(frozen=True)
class InKeyOrder:
    """A table's candidate rows in key order (CAND), each with its reference row."""

    rows: np.ndarray  # the candidates' rows, in key order
    reference: np.ndarray  # per entry of `rows`, the reference's row of the same prompt
    rank: np.ndarray  # per entry of `rows`, its rank within its candidate (0, 1, ...)
    runs: pl.DataFrame  # RUN, first, end of each candidate's entries in `rows` (as `runs` of them)
    found: Blocks  # the table's blocks
    keys: pl.DataFrame  # the table's keys (CAND)

    def prompts(self, model: str) -> pl.DataFrame:
        """The prompts of each of a model's blocks, in key order (those of its first block)."""
        first, end = self.found.runs.filter(pl.col("model") == model).select("first", "end").row(0)
        return self.keys.select(PROMPT[1:])[first:end][self.found.order[model]]


def in_key_order(keys: pl.DataFrame, reference: str, found: Blocks | None = None) -> InKeyOrder | None:
    """`keys` (CAND of a table's rows) in key order, found block by block; None where the rows are
    not in Blocks, or a model's candidates have no reference rows (the caller then joins and sorts).
    `found`: blocks(keys), where the caller has it."""
    found = found or blocks(keys)
    if found is None:
        return None
    ref_first = {model: first for model, _, first, _ in found.runs.filter(pl.col("target") == reference).iter_rows()}
    rows, refs, ranks = [], [], []
    candidates = found.runs.filter(pl.col("target") != reference).sort(RUN)
    for model, _target, first, end in candidates.iter_rows():
        if model not in ref_first:
            return None
        rows.append(first + found.order[model])
        refs.append(ref_first[model] + found.order[model])
        ranks.append(np.arange(end - first, dtype=np.int64))
    if not rows:
        return None
    sizes = (candidates["end"] - candidates["first"]).cast(pl.Int64)
    ends = sizes.cum_sum()
    placed = candidates.select(*RUN).with_columns(first=(ends - sizes).cast(pl.UInt32), end=ends.cast(pl.UInt32))
    return InKeyOrder(np.concatenate(rows), np.concatenate(refs), np.concatenate(ranks), placed, found, keys)


def same_entries(a: InKeyOrder, b: InKeyOrder) -> bool:
    """Whether entry i of `a.rows` and of `b.rows` hold the same keys (each in its own table), for
    every i: the same candidates with as many rows each, and each model's prompts the same in key
    order. Every block of a model holds its first block's prompts (`blocks`), so one block a model
    is compared, not every row (0.5 s of strings gathered at 100M token rows)."""
    if not a.runs.equals(b.runs):
        return False
    return all(a.prompts(model).equals(b.prompts(model)) for model in a.runs["model"].unique(maintain_order=True))


def runs(frame: pl.DataFrame) -> pl.DataFrame:
    """RUN, first and end row of each run of equal (model, target) in `frame`, where each candidate's
    rows lie together: found where the keys change, not by grouping every row on its strings."""
    first = run_starts(frame)
    # No rows (a target with parity off, judged before any candidate row): no run, not one ending at 0.
    end = np.append(first[1:], frame.height).astype(np.int64) if frame.height else first
    # Columns gathered one by one: `select` rechunks a table read from many files (0.3 s at 100M).
    return pl.DataFrame([frame[c].gather(first) for c in RUN]).with_columns(
        first=pl.Series(first, dtype=pl.UInt32), end=pl.Series(end, dtype=pl.UInt32)
    )


def run_starts(frame: pl.DataFrame) -> np.ndarray:
    """The rows where (model, target) differs from the row before (row 0 included), nulls equal to
    nulls: runs of equal values numbered, no hashing of every row's strings. (Comparing each row
    with its shifted neighbour copied the strings of a table read from many files: 0.7 s and
    0.7 GB at 100M token rows.) Each column's runs apart: a struct of columns chunked unlike
    (a table read from many files, keys concatenated) copies their strings to line them up
    (0.8 s at 100M token rows)."""
    if not frame.height:
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(frame.height, dtype=bool)
    for c in RUN:
        change |= np.diff(frame[c].rle_id().to_numpy(), prepend=-1).astype(bool)
    return np.flatnonzero(change)
