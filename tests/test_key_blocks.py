"""Candidate rows put in key order block by block (fleet/analysis/key_blocks.py) are those the join
on the prompt and the sort on the keys give, or the caller is told to join and sort."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from test_compare import DIVERGED, SAME, write_run
from test_report_aggregates import add_prompt_stats, assert_same_figures

from fleet.analysis import gates, key_blocks, key_order
from fleet.analysis.parity import CAND, PROMPT
from fleet.results import reader

REF = "ref"


def by_join_and_sort(keys: pl.DataFrame) -> tuple[list[int], list[int]]:
    """The definition: each candidate row with the reference row of its prompt, sorted on CAND."""
    rows = keys.with_row_index("_c")
    is_ref = pl.col("target") == REF
    paired = rows.filter(~is_ref).join(rows.filter(is_ref).select(*PROMPT, _r="_c"), on=PROMPT)
    paired = key_order.sort_by(paired, CAND)
    return paired["_c"].cast(pl.Int64).to_list(), paired["_r"].cast(pl.Int64).to_list()


def a_table(rng: np.random.Generator) -> pl.DataFrame:
    """Keys of a stored table: models' targets in blocks of the same prompts in the same (random)
    order, or one of the ways a real table breaks that."""
    how = rng.integers(0, 7)
    parts = []
    for model in rng.permutation(["m1", "m2"])[: rng.integers(1, 3)]:
        n = int(rng.integers(2, 6))
        sets, ids = rng.choice(["a", "b"], n), rng.permutation([f"p{i}" for i in range(n)])
        if how == 1:  # a prompt twice in every target
            sets[-1], ids[-1] = sets[0], ids[0]
        if how in (1, 6):  # the prompts in key order already (as prompt_stats hold them)
            keyed = sorted(zip(sets, ids, strict=True))
            sets, ids = np.array([s for s, _ in keyed]), np.array([i for _, i in keyed])
        for target in rng.permutation([REF, "c1", "c2", "c0"])[: rng.integers(2, 5)]:
            block = pl.DataFrame({"model": model, "target": target, "prompt_set": sets, "prompt_id": ids})
            if how == 2 and target != REF:  # a candidate's prompts in another order (another shard plan)
                block = block.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(1 << 30)))
            parts.append(block)
    keys = pl.concat(parts)
    if how == 3:  # a row missing (a failed shard)
        keys = keys.filter(pl.arange(0, keys.height) != int(rng.integers(keys.height)))
    elif how == 4:  # a target's rows in two places (two weight directories): a whole block again
        keys = pl.concat([keys, parts[int(rng.integers(len(parts)))]])
    elif how == 5:  # a key missing (a hand-edited or damaged table), in every block
        keys = keys.with_columns(prompt_id=pl.when(pl.col("prompt_id") != "p0").then(pl.col("prompt_id")))
    return keys


def test_blocks_give_the_join_and_sort_or_none() -> None:
    rng = np.random.default_rng(7)
    outcomes = {True: 0, False: 0}
    for _ in range(400):
        keys = a_table(rng)
        found = key_blocks.in_key_order(keys, REF)
        outcomes[found is not None] += 1
        if found is None:
            continue
        rows, refs = by_join_and_sort(keys)
        assert (found.rows.tolist(), found.reference.tolist()) == (rows, refs), keys
        # The rank of each row within its candidate, in key order.
        ordered = keys[found.rows].with_columns(rank=pl.Series(found.rank))
        expect = ordered.with_columns(pl.int_range(pl.len()).over("model", "target").alias("rank"))
        assert ordered.equals(expect)
        assert found.runs.equals(key_blocks.runs(keys[found.rows]))  # where each candidate's rows lie
    assert min(outcomes.values()) > 50, outcomes  # both ways taken


def test_tables_compared_block_by_block_as_row_by_row() -> None:
    """same_entries (the pairing's check that prompt_stats rows line up with the requests') says
    what comparing every entry's keys says: for another table of the same prompts in another
    order, and for one that lacks a candidate, a prompt or holds another."""
    rng = np.random.default_rng(11)
    outcomes = {True: 0, False: 0}
    for _ in range(300):
        keys = a_table(rng)
        found = key_blocks.in_key_order(keys, REF)
        if found is None:
            continue
        change = rng.integers(0, 4)
        # One permutation of each model's prompts, for every block of it (another shard plan).
        order: dict[str, np.ndarray] = {}
        parts = []
        for block in keys.partition_by("model", "target", maintain_order=True):
            parts.append(block[order.setdefault(block["model"][0], rng.permutation(block.height))])
        other = pl.concat(parts)
        if change == 1:  # a candidate missing
            candidates = other.filter(pl.col("target") != REF)["target"].unique().sort()
            other = other.filter(pl.col("target") != candidates[0])
        elif change == 2:  # another prompt in every block
            other = other.with_columns(prompt_id=pl.col("prompt_id").replace("p0", "p9"))
        other_found = key_blocks.in_key_order(other, REF)
        if other_found is None:
            continue
        by_rows = keys[found.rows].equals(other[other_found.rows])
        assert key_blocks.same_entries(found, other_found) == by_rows, (keys, other)
        outcomes[by_rows] += 1
    assert min(outcomes.values()) > 20, outcomes  # both answers met


def test_a_candidates_prompt_stats_in_another_order_give_the_same_figures(tmp_path: Path) -> None:
    """prompt_stats rows not in the reference's order (here a candidate's file reversed): the
    report sorts them on their keys and its figures are still those of the token rows."""
    run = write_run(tmp_path / "reversed", {"cand": DIVERGED, "cand2": SAME})
    add_prompt_stats(run)
    file = next(f for f in (run / "prompt_stats").glob("**/*.parquet") if "target=cand2" in str(f))
    table = pq.read_table(file)
    pq.write_table(table.take(list(range(table.num_rows))[::-1]).replace_schema_metadata(table.schema.metadata), file)
    stats = reader.load(run)["prompt_stats"].select(CAND).collect()
    assert key_blocks.in_key_order(stats, REF) is None
    assert key_blocks.in_key_order(reader.load(run)["requests"].select(CAND).collect(), REF) is not None
    assert_same_figures(run)


def test_coverage_counts_are_those_of_sets_of_prompts() -> None:
    """The gates' coverage check counts the same from blocks as from sets of prompts."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        keys = a_table(rng)
        prompts: dict[tuple[str, str], set[tuple[str, str]]] = {}
        for model, target, prompt_set, prompt_id in keys.iter_rows():
            prompts.setdefault((model, target), set()).add((prompt_set, prompt_id))
        n_ref = {m: len(p) for (m, t), p in prompts.items() if t == REF}
        n_both = {(m, t): len(p & prompts[m, REF]) for (m, t), p in prompts.items() if m in n_ref}
        assert gates._answered(keys, REF) == (n_ref, {k: n for k, n in n_both.items() if n}), keys
