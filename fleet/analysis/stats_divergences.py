"""Each candidate prompt's first divergence from prompt_stats, classified as divergence.divergences
classifies it from token rows (fleet/analysis/from_stats.py pairs the prompts).

The values at the divergence (the reference's teacher-forced top-1 and its logprob, whether the
candidate's token is in the reference's top-k and the reference's top-1 in the candidate's) are
read from flat per-position lists, one `list.get` per prompt; the top-k lists, the bulk of
prompt_stats, only where the reference's output there is not its teacher-forced top-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from fleet.analysis import divergence
from fleet.analysis.aligned import Flat
from fleet.analysis.from_stats import NO_POSITION, Pairs
from fleet.analysis.noise_model import NoiseSpec
from fleet.analysis.parity import CAND, RUN
from fleet.results.prompt_stats import SPLIT

_AT_DIVERGENCE = ["ref_top1_logprobs", "in_ref_topk", "ref_top1_ids", "ref_top1_in_topk"]  # flat lists


def at_divergence_lists(stats: pl.LazyFrame, reference: str) -> pl.DataFrame:
    """The flat per-position lists `divergences` reads, of every candidate prompt in file order
    (the caller may read them while other work runs: Polars decodes without holding the GIL)."""
    return stats.filter(pl.col("target") != reference).select(_AT_DIVERGENCE).collect()


def divergences(
    pairs: Pairs,
    stats: pl.LazyFrame,
    spec: NoiseSpec,
    table: pl.DataFrame,
    *,
    lists: pl.DataFrame | None = None,
    found: Located | None = None,
) -> pl.DataFrame:
    """divergence.divergences: each candidate prompt's first divergence, classified from its lists
    (`stats`: the scan `pairs` was loaded from; `lists`: its at_divergence_lists, if read already;
    `found`: located(pairs), if found already)."""
    seq = pairs.seq
    found = found or located(pairs)
    where, at = found.where, found.at
    ids = pairs.tokens_at_divergence
    file_row = pairs.cand["_file_row"].to_numpy()
    # Each divergence that is its prompt's top1_split (nearly all: the reference's output followed
    # its teacher-forced top-1 until there) has its values in the split columns; else every
    # position's lists are read.
    value = split_values(pairs, found)
    if value is None:
        value = _at_rows(at_divergence_lists(stats, pairs.reference) if lists is None else lists, file_row[where], at)
        value["_ref_lp"] = Flat(pairs.lists("ref_logprobs")).at(where, at)
    del lists
    frame = seq.select(*CAND, "first_divergence").with_columns(
        cand_token=pl.when(pl.Series(at != NO_POSITION)).then(ids["_cand_token"]),
        ref_token=ids["_ref_token"],
        _ref_lp=value["_ref_lp"],
    )
    # The reference's output at the divergence is nearly always its teacher-forced top-1 there,
    # and for it prompt_stats holds ref_in_cand_topk as a flat list. The top-k lists, the bulk of
    # prompt_stats, are read only for the other divergences (and runs written before those
    # columns), streamed from the files by row number, so they are never all in memory.
    known = (value["ref_top1_ids"].cast(pl.Int32) == ids["_ref_token"]).fill_null(False).to_numpy()
    frame = frame.with_columns(
        _ref_top1_lp=value["ref_top1_logprobs"],
        cand_in_ref_topk=value["in_ref_topk"],
        _known=value["ref_top1_in_topk"],
    )
    wanted = np.flatnonzero((at != NO_POSITION) & ~known)
    needed = pl.DataFrame({"_file_row": file_row[where[wanted]], "_d": at[wanted], "_seq": wanted}).lazy()
    lists = (
        stats.filter(pl.col("target") != pairs.reference)
        .select("topk_ids")
        .with_row_index("_file_row")
        .join(needed.with_columns(pl.col("_file_row").cast(pl.UInt32)), on="_file_row")
        .select("_seq", _cand_topk=pl.col("topk_ids").list.get(pl.col("_d")))
        .collect(engine="streaming")
        if wanted.size
        else pl.DataFrame(schema={"_seq": pl.UInt32, "_cand_topk": pl.List(pl.Int32)})
    )
    frame = frame.with_row_index("_seq").join(
        lists.cast({"_seq": pl.UInt32}), on="_seq", how="left", maintain_order="left"
    )
    unknown = pl.col("_cand_topk").list.contains(pl.col("ref_token"))
    frame = frame.with_columns(ref_in_cand_topk=pl.when(pl.Series(known)).then(pl.col("_known")).otherwise(unknown))
    thresholds = divergence.thresholds(seq.lazy(), spec, table)
    # In seq's order, which is key order: classify need not sort again.
    return divergence.classify(
        frame.lazy().join(thresholds, on=RUN, how="left", maintain_order="left"), in_key_order=True
    )


def _positions(pairs: Pairs) -> tuple[np.ndarray, np.ndarray]:
    """Per seq row: its cand row (0 where none) and the position of its first divergence there
    (NO_POSITION: no divergence, or the candidate has no token row there)."""
    d = pairs.seq["first_divergence"].fill_null(NO_POSITION).to_numpy()
    c = pairs.cand_row
    where = np.where(c >= 0, c, 0)
    n = np.where(c >= 0, pairs.cand["n_positions"].fill_null(0).to_numpy()[where], 0)
    return where, np.where(d < n, d, NO_POSITION)


@dataclass(frozen=True)
class Located:
    """Per seq row, its cand row and where its first divergence is (`_positions`); and whether every
    divergence is its prompt's top1_split (then `divergences` reads no list of every position)."""

    where: np.ndarray
    at: np.ndarray
    at_splits: bool


def located(pairs: Pairs) -> Located:
    """The first divergences of `pairs`, found once for the report's two steps that ask (whether
    to read the lists beside the figures, then the divergences: 0.4 s at 100M token rows each)."""
    where, at = _positions(pairs)
    return Located(where, at, _at_splits(pairs, where, at))


def _at_splits(pairs: Pairs, where: np.ndarray, at: np.ndarray) -> bool:
    """Whether the run has split columns and every divergence is its prompt's top1_split."""
    if not pairs.aggregated:
        return False
    asked = at != NO_POSITION
    split = pairs.cand["top1_split"].fill_null(-1).cast(pl.Int64).to_numpy()[where]
    return bool((split[asked] == at[asked]).all())


def split_values(pairs: Pairs, found: Located) -> dict[str, pl.Series] | None:
    """The values at each divergence from the split columns (null where `at` is NO_POSITION), or
    None where a run has no such columns or some divergence is not its prompt's top1_split."""
    if not found.at_splits:
        return None
    columns = {"_ref_lp": "split_ref_logprob"} | {listed: name for name, listed in SPLIT.items()}
    where, asked = found.where, found.at != NO_POSITION
    return {key: pairs.cand[name].gather(where).set(pl.Series(~asked), None) for key, name in columns.items()}


def _at_rows(lists: pl.DataFrame, rows: np.ndarray, positions: np.ndarray) -> dict[str, pl.Series]:
    """Per (row, position) pair, each list column's value there (null past its list, or where the
    position is NO_POSITION): one list.get per row of `lists` when no row is asked twice (the report's
    case), without flattening every list."""
    asked = positions != NO_POSITION
    if np.unique(rows[asked]).size != int(asked.sum()):  # a row asked at two positions
        return {name: Flat(lists[name]).at(rows, positions) for name in lists.columns}
    index = np.full(lists.height, -1, dtype=np.int64)
    index[rows[asked]] = positions[asked]
    at = pl.Series(index).replace(-1, None)
    found = lists.select(pl.all().list.get(pl.lit(at), null_on_oob=True))
    return {name: found[name].gather(rows).set(pl.Series(~asked), None) for name in lists.columns}


def summary_of(per_prompt: pl.DataFrame, own: pl.DataFrame, table: pl.DataFrame) -> pl.DataFrame:
    """divergence.summary_of, its TF p99 and noise model already computed."""
    return divergence.summary_of(per_prompt, pl.DataFrame(), "", noise_table=table, own=own)
