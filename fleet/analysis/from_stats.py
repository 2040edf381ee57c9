"""The report's token figures from prompt_stats (fleet/results/prompt_stats.py): prompts joined with
prompts, never token rows with token rows.

Each function returns what its namesake over token rows returns (fleet/analysis/parity.py,
divergence.py, noise_model.py), and the figures are the same: sums, extrema and exact quantiles
over the same values, the bootstrap over the same resamples (fleet/analysis/bootstrap.py). Only the
order of floating-point additions differs. Per-position values are taken from the flat Arrow
buffers of the lists, one candidate at a time, so no per-token frame with string keys is built.
The run's `prompt_stats` must cover every tokens file and hold contiguous positions (`usable`);
otherwise the report reads token rows as before. The first divergences are classified from the
same pairs in fleet/analysis/stats_divergences.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

from fleet.analysis import (
    aligned,
    divergence,
    from_tails,
    key_blocks,
    key_order,
    linear_quantile,
    noise_model,
    parity,
    prefix_pairs,
)
from fleet.analysis.noise_model import NoiseSpec
from fleet.analysis.parity import CAND, PROMPT, RUN
from fleet.results.prompt_stats import SPLIT

_F64 = pl.Float64
_CAND_COLUMNS = ["n_positions", "first_token_id", "first_top1_tied", "logprobs", "ref_logprobs", "twin_logprobs"]
_CAND_COLUMNS += ["top1_scored", "top1_agreed", "kl_positions", "kl_sum", "kl_nan", *from_tails.COLUMNS]
_CAND_COLUMNS += ["first_ref_logprob", "top1_split", "split_ref_logprob", *SPLIT]
# Lists every position of which only the figures of runs without aggregates read (and fallbacks).
_POSITION_LISTS = ("ref_logprobs", "twin_logprobs")
NO_POSITION = np.iinfo(np.int64).max  # a position no list reaches (no divergence)
Row = dict[str, Any] | None  # first_divergence of identical outputs: the prefix is everything


def usable(stats: pl.LazyFrame) -> bool:
    """Whether every prompt's lists are indexed by position (a prompt with a gap in its positions
    would be compared at the wrong ones)."""
    return bool(stats.select(pl.col("contiguous").fill_null(False).all()).collect().item())


@dataclass(frozen=True)
class Pairs:
    """Candidate prompts paired with the reference's: `sequences` (sorted by CAND), the tokens at
    each first divergence, and both sides' prompt_stats rows as stored (each candidate's rows
    together, in file order: sorting lists of every token would cost a copy of them)."""

    seq: pl.DataFrame  # parity.sequences
    tokens_at_divergence: pl.DataFrame  # per seq row: _cand_token, _ref_token (output ids at first_divergence)
    cand: pl.DataFrame  # every candidate prompt_stats row (CAND, _CAND_COLUMNS, prompt: rank in key order)
    ref: pl.DataFrame  # the reference's rows: PROMPT, first_token_id, logprobs
    logprobs: aligned.Flat  # cand's logprobs lists, flat: the figures and the noise floor read them
    cand_row: np.ndarray  # per seq row, its cand and ref row (-1: none)
    ref_row: np.ndarray
    reference: str
    one_to_one: bool = False  # every cand row is one seq row's (cand_row is a permutation of them)
    # Every cand row has the shards' aggregates (then _POSITION_LISTS are read only if asked, from `source`).
    aggregated: bool = False
    source: pl.LazyFrame | None = None  # the candidates' prompt_stats rows, scanned
    # Per seq row, its request row, where each candidate's requests hold the reference's prompts
    # in the same order (key_blocks); None where they may not (then a pair of candidates may share
    # prompts the seq rows lack).
    request_row: np.ndarray | None = None
    # The requests' output ids, flat, as the pairing made them: the noise floor compares them too.
    ids: aligned.Lists | None = None
    # key_blocks.runs of `seq`, where the pairing placed each candidate's rows (else found from seq's keys).
    seq_runs: pl.DataFrame | None = None

    def without_ids(self) -> Pairs:
        """These pairs, the output ids let go (at 100M token rows they would add 0.4 GB to the
        figures' peak, which read them no more)."""
        return replace(self, ids=None)

    @classmethod
    def load(
        cls, requests: pl.DataFrame, stats: pl.LazyFrame, reference: str, blocks: key_blocks.Blocks | None = None
    ) -> Pairs:
        """`blocks`: key_blocks.blocks of the requests' keys, where the caller has them."""
        is_ref = pl.col("target") == reference
        source = stats.filter(~is_ref)
        aggregated = bool(source.select(pl.col("tf_positions").is_not_null().all()).collect().item())
        columns = [c for c in _CAND_COLUMNS if not (aggregated and c in _POSITION_LISTS)]
        # Both sides' prompt_stats rows are read (Polars, without the GIL) while the output ids are
        # compared (numpy).
        read = [
            source.select(*CAND, *columns).with_row_index("_file_row"),
            stats.filter(is_ref).select(*PROMPT, "first_token_id", "logprobs"),
        ]
        with ThreadPoolExecutor(1) as pool:
            reading = pool.submit(pl.collect_all, read)
            seq, at_d, found, ids = cls._compared(requests, reference, blocks)
            cand, ref = reading.result()
        keys = seq.select(CAND)
        # Each prompt's rank in key order within its candidate (the bootstrap's unit, noise_model.one),
        # and the rows of each seq row: nearly always one stats row per paired prompt, no join.
        ref_keys = ref.select(PROMPT).with_columns(target=pl.lit(reference, pl.String)).select(CAND)
        stored = key_blocks.in_key_order(pl.concat([cand.select(CAND), ref_keys]), reference)
        if stored is not None:
            prompt = np.empty(cand.height, dtype=np.int64)
            prompt[stored.rows] = stored.rank
            if found is not None:  # seq's rows are found.rows: the two compared block by block
                one_to_one = key_blocks.same_entries(stored, found)
            else:
                one_to_one = cand.select(CAND)[stored.rows].equals(keys)
            cand_rows = stored.rows if one_to_one else _rows_of(keys, cand.select(CAND), CAND)
            ref_rows = stored.reference - cand.height if one_to_one else _rows_of(keys, ref.select(PROMPT), PROMPT)
            cand = cand.with_columns(prompt=pl.Series(prompt))
        else:
            cand, one_to_one, cand_rows = _ranked(cand, keys)
            ref_rows = _rows_of(keys, ref.select(PROMPT), PROMPT)
        return cls(
            seq,
            at_d,
            cand,
            ref,
            aligned.Flat(cand["logprobs"]),
            cand_rows,
            ref_rows,
            reference,
            one_to_one=one_to_one,
            aggregated=aggregated,
            source=source,
            request_row=found.rows if found is not None else None,
            ids=ids,
            seq_runs=found.runs if found is not None else None,
        )

    @staticmethod
    def _compared(
        requests: pl.DataFrame, reference: str, blocks: key_blocks.Blocks | None
    ) -> tuple[pl.DataFrame, pl.DataFrame, key_blocks.InKeyOrder | None, aligned.Lists]:
        """(seq, tokens_at_divergence, the candidates' request rows in key order, the output ids) of
        the candidates' requests against the reference's."""
        is_ref = pl.col("target") == reference
        # Keys paired and put in key order block by block where the requests allow it (key_blocks),
        # else joined alone; the id lists are compared where they lie, by row (a join, sort or
        # gather carrying the lists would copy every output token).
        found = key_blocks.in_key_order(requests.select(CAND), reference, blocks)
        if found is not None:
            cand_rows, ref_rows = found.rows, found.reference
            keys = requests.select(CAND)[cand_rows]
        else:
            keys = requests.select(*CAND).with_row_index("_c")
            keys = key_order.sort_by(
                keys.filter(~is_ref).join(keys.filter(is_ref).select(*PROMPT, _r="_c"), on=PROMPT), CAND
            )
            cand_rows, ref_rows = (keys[k].to_numpy().astype(np.int64) for k in ("_c", "_r"))
        ids = aligned.Lists(requests["output_token_ids"])
        seq = parity.sequences_of(keys.select(CAND), aligned.compare_rows(ids, cand_rows, ref_rows))
        d = seq["first_divergence"].fill_null(-1).to_numpy()
        at = np.where(d >= 0, d, np.iinfo(np.int32).max)
        at_d = pl.DataFrame({"_cand_token": ids.at(cand_rows, at), "_ref_token": ids.at(ref_rows, at)}).select(
            pl.all().replace(-1, None).cast(pl.Int32)
        )
        return seq, at_d, found, ids

    def lists(self, name: str) -> pl.Series:
        """A list column of the cand rows, in their order: loaded with them, or read now."""
        if name in self.cand.columns or self.source is None:
            return self.cand[name]
        return self.source.select(name).collect()[name].gather(self.cand["_file_row"])

    def seq_bounds(self) -> pl.DataFrame:
        """key_blocks.runs of `seq`: RUN, first and end row of each candidate's seq rows."""
        return self.seq_runs if self.seq_runs is not None else key_blocks.runs(self.seq)

    def candidates(self) -> Iterator[tuple[str, str, int, int, int, int]]:
        """(model, target, first cand row, end, first seq row, end) of each candidate's blocks."""
        both = key_blocks.runs(self.cand).join(self.seq_bounds(), on=RUN, how="left", suffix="_seq")
        yield from both.with_columns(pl.col("first_seq", "end_seq").fill_null(0)).iter_rows()


def _ranked(cand: pl.DataFrame, keys: pl.DataFrame) -> tuple[pl.DataFrame, bool, np.ndarray]:
    """cand with each prompt's rank in key order within its candidate (`prompt`), whether its rows
    pair one to one with `keys` (seq's), and each seq row's cand row: sorted on the string keys."""
    # Runs of one (model, target) under two weight directories would interleave: then sort them together.
    heads = cand.select(RUN)[key_blocks.run_starts(cand)]
    if heads.n_unique() != heads.height:
        cand = cand.sort(RUN, maintain_order=True)
    order = key_order.sort_by(cand.select(CAND).with_row_index("_c"), CAND)
    first = key_blocks.runs(order)["first"].to_numpy().astype(np.int64)
    rank = np.arange(order.height) - np.repeat(first, np.diff(np.append(first, order.height)))
    prompt = np.empty(order.height, dtype=np.int64)
    prompt[order["_c"].to_numpy()] = rank
    one_to_one = order.select(CAND).equals(keys)
    rows = order["_c"].cast(pl.Int64).to_numpy() if one_to_one else _rows_of(keys, cand.select(CAND), CAND)
    return cand.with_columns(prompt=pl.Series(prompt)), one_to_one, rows


def _rows_of(keys: pl.DataFrame, rows: pl.DataFrame, on: list[str]) -> np.ndarray:
    """Per row of `keys`, the row of `rows` with the same `on` columns (-1: none)."""
    found = keys.join(rows.with_row_index("_row"), on=on, how="left", maintain_order="left")
    return found["_row"].cast(pl.Int64).fill_null(-1).to_numpy()


def first_step(pairs: Pairs) -> pl.DataFrame:
    """parity.first_step: position 0 of both sides, from each prompt's first entries."""
    cand0 = pairs.cand.lazy().select(
        *CAND,
        cand_token_id="first_token_id",
        cand_logprob=pl.col("logprobs").list.first().cast(_F64),
        _tf_logprob=(pl.col("first_ref_logprob") if pairs.aggregated else pl.col("ref_logprobs").list.first()).cast(
            _F64
        ),
        _tied="first_top1_tied",
    )
    ref0 = pairs.ref.lazy().select(
        *PROMPT, ref_token_id="first_token_id", ref_logprob=pl.col("logprobs").list.first().cast(_F64)
    )
    if not pairs.one_to_one:
        have = pl.col("cand_token_id").is_not_null()
        return parity.first_step_of(cand0.filter(have), ref0.filter(pl.col("ref_token_id").is_not_null()))
    # Each seq row's candidate and reference rows are known: the join's pairs by gathers, already
    # in key order (seq's), with no join or sort of string keys; the keys are seq's own (one to one,
    # cand_row gathers the same ones: 0.4 s of strings at 100M token rows).
    cand = pl.concat([pairs.seq.select(CAND), cand0.drop(CAND).collect()[pairs.cand_row]], how="horizontal")
    paired = pl.concat([cand, _gathered(ref0.drop(PROMPT).collect(), pairs.ref_row)], how="horizontal")
    both = pl.col("cand_token_id").is_not_null() & pl.col("ref_token_id").is_not_null()
    return parity.first_step_figures(paired.lazy().filter(both)).collect()


def _gathered(frame: pl.DataFrame, rows: np.ndarray) -> pl.DataFrame:
    """frame's rows at `rows`, all null where a row is -1."""
    found = frame[np.where(rows >= 0, rows, 0)] if frame.height else frame.clear(len(rows))
    return found.select(pl.when(pl.Series(rows >= 0)).then(pl.all()))


def figures(pairs: Pairs, first: pl.DataFrame, spec: NoiseSpec) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(parity.parity, noise_model.summary, divergence.noise) from one pass over each candidate's lists."""
    prompt = pairs.cand["prompt"].to_numpy()
    flat: dict[str, aligned.Flat] = {}  # every position's values, made for the first candidate that needs them
    logprobs = pairs.logprobs, aligned.Flat(pairs.ref["logprobs"])  # each side's

    def candidate(model: str, target: str, first_row: int, end: int, first_seq: int, end_seq: int) -> tuple[Row, Row]:
        prefix = _prefix(pairs, first_seq, end_seq, *logprobs)
        key = {"model": model, "target": target}
        merged = from_tails.figures(pairs.cand[first_row:end], prompt[first_row:end], spec, model, target)
        if merged is not None:  # from the shards' aggregates
            return key | merged[0] | prefix, key | merged[1]
        if not flat:
            flat.update((c, aligned.Flat(pairs.lists(c))) for c in ("logprobs", "ref_logprobs", "twin_logprobs"))
        lp, ref_lp, twin_lp = flat["logprobs"], flat["ref_logprobs"], flat["twin_logprobs"]
        # numpy, not frames: these are the largest arrays of the report, and numpy hands them back
        # to the system when freed (Polars' allocator keeps what it had).
        ref = ref_lp.numbers(first_row, end)
        # Differences of float32 logprobs taken in float64, as the token-row figures take them.
        cand_diff = np.subtract(lp.numbers(first_row, end), ref, dtype=np.float64)
        twin_diff = np.subtract(twin_lp.numbers(first_row, end), ref, dtype=np.float64)  # NaN: no twin there
        np.abs(cand_diff, out=cand_diff)
        np.abs(twin_diff, out=twin_diff)
        scored = ~ref_lp.nulls(first_row, end) & ~lp.nulls(first_row, end)  # null: unscored; a NaN counts
        del ref
        every = bool(scored.all())  # then no copies: these arrays are the run's size
        cand_diff = cand_diff if every else cand_diff[scored]
        nan = bool(np.isnan(cand_diff).any())
        tf: dict[str, float | None] = dict.fromkeys(_TF)
        if cand_diff.size and not nan:
            p99 = linear_quantile.quantile(cand_diff, divergence.NOISE_QUANTILE)
            tf = dict(zip(_TF, map(float, (cand_diff.max(), cand_diff.mean(), p99)), strict=True))
        if not cand_diff.size:  # nothing scored: no noise-model row, as from token rows
            return key | tf | prefix, None
        units = np.repeat(prompt[first_row:end].astype(np.int32), lp.n[first_row:end])
        units, twin_diff = (units, twin_diff) if every else (units[scored], twin_diff[scored])
        one = noise_model.one(cand_diff, twin_diff, units, spec, model, target, cand_p99=tf[_TF[2]])
        return key | tf | prefix, key | one

    # One candidate at a time: two in threads measured 15 % faster on 2 cores but held both
    # candidates' arrays at once (+150 MB at 10M token rows, past the 1 GB goal).
    done = [candidate(*bounds) for bounds in pairs.candidates()]
    rows = [row for row, _ in done]
    noise_rows = [row for _, row in done if row is not None]
    schema = {"model": pl.String, "target": pl.String} | dict.fromkeys([*_TF, "pearson_r", "mae"], _F64)
    per_candidate = pl.DataFrame(rows, schema=schema)
    cand = pairs.cand.lazy()
    scored_n, kl_n = pl.col("top1_scored").sum(), pl.col("kl_positions").sum()
    sums = cand.group_by(RUN).agg(
        tf_top1_agreement=pl.when(scored_n > 0).then(pl.col("top1_agreed").sum() / scored_n),
        kl_topk_mean=pl.when(pl.col("kl_nan").any()).then(None).when(kl_n > 0).then(pl.col("kl_sum").sum() / kl_n),
    )
    table = parity.assemble(
        parity.sequence_figures(pairs.seq.lazy()),
        parity.first_figures(first),
        sums.join(per_candidate.lazy().drop("tf_p99_abs_logprob_diff"), on=RUN, how="left"),
    )
    own = per_candidate.select(*RUN, "tf_p99_abs_logprob_diff").sort(RUN)
    return table, noise_model.frame(noise_rows), own


_TF = ["tf_max_abs_logprob_diff", "tf_mean_abs_logprob_diff", "tf_p99_abs_logprob_diff"]


def _prefix(pairs: Pairs, first_seq: int, end_seq: int, cand: aligned.Flat, ref: aligned.Flat) -> dict[str, Any]:
    """pearson_r and mae (parity.prefix_expressions) of the logprobs of both sides at every position
    of the common prefix of seq rows first_seq..end_seq-1, the pairs parity's join of token rows
    gives (`cand`, `ref`: the logprobs lists of pairs.cand and pairs.ref)."""
    cand_row, ref_row = pairs.cand_row[first_seq:end_seq], pairs.ref_row[first_seq:end_seq]
    has = (cand_row >= 0) & (ref_row >= 0)
    c, r = np.where(has, cand_row, 0), np.where(has, ref_row, 0)
    first = pairs.seq["first_divergence"][first_seq:end_seq].fill_null(NO_POSITION).to_numpy()
    n = np.zeros(len(c), dtype=np.int64)
    if has.any():
        n = np.where(has, np.minimum(np.minimum(cand.n[c], ref.n[r]), first), 0)
    if prefix_pairs.holds_no_null(cand, ref):  # a chunk at a time, in numpy
        pearson, diff = prefix_pairs.Pearson(), prefix_pairs.AbsDiff()
        for cand_lp, ref_lp in prefix_pairs.chunks(cand, c, ref, r, n):
            pearson.add(cand_lp, ref_lp)
            diff.add(cand_lp, ref_lp)
        return {"pearson_r": pearson.r(), "mae": diff.mean()}
    row, position = aligned.common(n)
    frame = pl.DataFrame(
        {
            "_cand_lp": cand.at(c[row], position, inside_lists=True).cast(_F64),
            "_ref_lp": ref.at(r[row], position, inside_lists=True).cast(_F64),
        }
    )
    return frame.select(**parity.prefix_expressions()).row(0, named=True)
