"""prompt_stats as the driver computes it (fleet/results/prompt_rows.py, topk_arrays.py) against its
definition: the shard's token rows sorted by prompt and position, grouped per prompt, with
prompt_stats' Polars expressions per row (`by_sort` below, what summarize ran before). The rows
must be the same to the bit: Parquet bytes of both tables are compared."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet.contracts import schema
from fleet.results import prompt_rows, prompt_stats, prompt_tails, topk_arrays
from fleet.results.prompt_stats import PROMPT


def by_sort(tokens: pa.Table, *, kl_sum: str = "list") -> pa.Table:
    """The definition, as summarize computed it before. `kl_sum="group"`: the group-by's own sum,
    which Polars' streaming engine splits where it cut the sorted rows into batches (a prompt
    across a cut: its two partial sums added, the last bit can differ); "list": each prompt's
    values summed at once, as the driver does (the same on one thread)."""
    frame = pl.from_arrow(schema.conform(tokens, schema.TOKENS))
    assert isinstance(frame, pl.DataFrame)
    lazy = frame.lazy()
    at0 = pl.col("position") == 0
    if frame.get_column("ref_topk_ids").null_count() == frame.height:
        lazy = lazy.with_columns(_tied=pl.lit(None, pl.Boolean), _kl=pl.lit(None, pl.Float64))
    else:
        k = prompt_stats.longest_topk(lazy)
        lazy = lazy.with_columns(**prompt_stats.topk_slots(k)).with_columns(
            _tied=prompt_stats.top1_agreement(k, materialized=True),
            _kl=pl.when(prompt_stats.both_topk()).then(prompt_stats.kl(k, materialized=True)),
        )
    rows = (
        lazy.sort(*PROMPT, "position")
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
            ref_top1_ids=pl.col("ref_topk_ids").list.first(),
            ref_top1_in_topk=pl.col("topk_ids").list.contains(pl.col("ref_topk_ids").list.first()),
            top1_scored=pl.col("_tied").is_not_null().sum().cast(pl.Int32),
            top1_agreed=pl.col("_tied").sum().cast(pl.Int32),
            kl_positions=pl.col("_kl").is_not_null().sum().cast(pl.Int32),
            kl_sum=pl.col("_kl").sum() if kl_sum == "group" else pl.col("_kl"),
            kl_nan=pl.col("_kl").is_nan().any(),
        )
        .collect()
    )
    if kl_sum == "list":
        rows = rows.with_columns(pl.col("kl_sum").list.sum())
    rows = pl.concat([rows, _aggregates(frame)], how="horizontal") if rows.height else rows
    return schema.conform(rows.to_arrow(), schema.PROMPT_STATS)


def _aggregates(frame: pl.DataFrame) -> pl.DataFrame:
    """The |dlogp| aggregates and the top-1 split (prompt_tails, prompt_rows._at_split) by their
    definition: per prompt in key order; each floor the shard's value its top TAIL_SHARE reach."""
    ref = pl.col("ref_logprob").cast(pl.Float64)
    scored = pl.col("logprob").is_not_null() & pl.col("ref_logprob").is_not_null()
    frame = frame.sort(*PROMPT, "position").with_columns(
        _d=(pl.col("logprob").cast(pl.Float64) - ref).abs(), _w=(pl.col("twin_logprob").cast(pl.Float64) - ref).abs()
    )
    frame = frame.with_columns(_scored=scored, _twinned=scored & pl.col("_w").is_not_null() & ~pl.col("_w").is_nan())
    floors = {}
    for side, present in (("_d", pl.col("_scored") & ~pl.col("_d").is_nan()), ("_w", pl.col("_twinned"))):
        values = frame.filter(present)[side].sort(descending=True)
        n = len(values)
        keep = int(np.ceil(n * prompt_tails.TAIL_SHARE))
        floors[side] = None if not n else 0.0 if n <= prompt_tails.TAIL_ALL else values[keep - 1]
    d, w = pl.col("_d"), pl.col("_w")
    ref_top1 = pl.col("ref_topk_ids").list.first()
    differ = ~(pl.col("token_id") == ref_top1).fill_null(False)
    at_split = {
        "split_ref_logprob": pl.col("ref_logprob"),
        "split_ref_top1_logprob": pl.col("ref_topk_logprobs").list.first(),
        "split_in_ref_topk": pl.col("ref_topk_ids").list.contains(pl.col("token_id")).fill_null(False),
        "split_ref_top1_id": ref_top1,
        "split_ref_top1_in_topk": pl.col("topk_ids").list.contains(ref_top1),
    }

    def tail(side: pl.Expr, present: pl.Expr, floor: float | None) -> pl.Expr:
        return side.filter(present & (side >= floor)) if floor is not None else side.filter(pl.lit(False))

    return (
        frame.group_by(PROMPT, maintain_order=True)
        .agg(
            tf_positions=pl.col("_scored").sum().cast(pl.Int32),
            twin_positions=pl.col("_twinned").sum().cast(pl.Int32),
            tf_abs_sum=pl.when(pl.col("_scored")).then(d).otherwise(0.0),
            tf_abs_max=pl.when(d.filter(pl.col("_scored")).is_nan().any())
            .then(float("nan"))
            .otherwise(d.filter(pl.col("_scored")).max()),
            tf_tail_floor=pl.lit(floors["_d"], pl.Float64),
            tf_abs_tail=tail(d, pl.col("_scored") & ~d.is_nan(), floors["_d"]),
            twin_tail_floor=pl.lit(floors["_w"], pl.Float64),
            twin_abs_tail=tail(w, pl.col("_twinned"), floors["_w"]),
            first_ref_logprob=pl.col("ref_logprob").filter(pl.col("position") == 0).first(),
            top1_split=pl.int_range(pl.len()).filter(differ).first().cast(pl.Int32),
            **{name: value.filter(differ).first() for name, value in at_split.items()},
        )
        .with_columns(pl.col("tf_abs_sum").list.sum())
        .drop(PROMPT)
    )


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="none", use_dictionary=False)
    return bytes(sink.getvalue().to_pybytes())


def shard(rng: np.random.Generator, prompts: int, longest: int, k: int, **kind: bool) -> pa.Table:
    """Token rows of `prompts` prompts up to `longest` positions, top-`k`, with many exact ties
    (logprobs on a 0.1 grid, ids from a small vocabulary). kind: ragged (lengths and top-k lists
    vary, null lists and logprobs), shuffled (rows out of order), nan (a NaN logprob)."""
    lengths = rng.integers(1, longest + 1, prompts) if kind.get("ragged") else np.full(prompts, longest)
    n = int(lengths.sum())

    def lists(values: Any, sizes: np.ndarray, nulls: np.ndarray | None = None) -> pa.Array:
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values(int(offsets[-1]))), mask=nulls)

    def ids(m: int) -> np.ndarray:
        return rng.integers(0, 12, m).astype(np.int32)

    def logprobs(m: int) -> np.ndarray:
        return -np.round(rng.random(m) * 3, 1).astype(np.float32)

    cand_k = rng.integers(0, k + 1, n) if kind.get("ragged") else np.full(n, k)
    ref_k = rng.integers(0, k + 1, n) if kind.get("ragged") else np.full(n, k)
    unscored = pa.array(rng.random(n) < 0.05)
    null_lp = rng.random(n) < (0.1 if kind.get("ragged") else 0.0)
    logprob = pa.array(logprobs(n), mask=null_lp)
    if kind.get("nan"):
        logprob = pa.array(np.where(np.arange(n) == n // 2, np.nan, logprobs(n)).astype(np.float32))
    table = pa.table(
        {
            "model": ["m"] * n,
            "model_weights": ["w"] * n,
            "target": ["cand"] * n,
            "prompt_set": ["p"] * n,
            "prompt_id": np.repeat(np.array([f"q{i}" for i in rng.permutation(prompts)]), lengths),
            "position": np.concatenate([np.arange(m) for m in lengths]).astype(np.int32),
            "token_id": ids(n),
            "logprob": logprob,
            "rank": np.ones(n, np.int32),
            "topk_ids": lists(ids, cand_k),
            "topk_logprobs": lists(logprobs, cand_k),
            "ref_logprob": pa.array(logprobs(n), mask=null_lp),
            "ref_rank": np.ones(n, np.int32),
            "ref_topk_ids": lists(ids, ref_k, unscored),
            "ref_topk_logprobs": lists(logprobs, ref_k, unscored),
            "twin_logprob": logprobs(n),
        }
    )
    return table.take(pa.array(rng.permutation(n))) if kind.get("shuffled") else table


@pytest.mark.parametrize(
    ("prompts", "longest", "k", "kind", "arrays"),
    [
        (40, 30, 5, {}, True),
        (60, 40, 5, {"ragged": True}, True),
        (50, 20, 3, {"ragged": True, "shuffled": True}, True),
        (30, 300, 20, {"ragged": True}, True),
        (40, 20, 5, {"nan": True}, False),  # a NaN: the Polars expressions themselves
    ],
)
def test_prompt_stats_are_the_sorted_group_by_to_the_bit(
    prompts: int, longest: int, k: int, kind: dict[str, bool], arrays: bool
) -> None:
    rng = np.random.default_rng(prompts * longest + k)
    tokens = shard(rng, prompts, longest, k, **kind)
    conformed = schema.conform(tokens, schema.TOKENS)
    assert (topk_arrays.per_row(conformed, k) is not None) == arrays  # the path this case is for
    got, expected = prompt_rows.summarize(tokens), by_sort(tokens)
    assert got.num_rows == prompts
    assert got.schema.equals(expected.schema)
    assert parquet_bytes(got) == parquet_bytes(expected)
    tied = pc_sum(got, "top1_agreed")
    assert 0 < tied < pc_sum(got, "top1_scored")  # ties broken both ways: the rule was exercised


def pc_sum(table: pa.Table, column: str) -> int:
    return int(np.asarray(table.column(column)).sum())


def test_a_test_double_shard_as_before_and_a_reference_shard(tmp_path: Any, monkeypatch: Any) -> None:
    """Engine-shaped shards: 128 prompts x 16 tokens (the rows split evenly wherever the group-by
    cut them, so even its own sums agree) from the test double, scored and not."""
    monkeypatch.setenv("FLEET_ALLOW_TEST_DOUBLE", "1")
    from actors.test_double import TestDoubleEngine
    from fleet.contracts.backend_args import TestDoubleArgs
    from fleet.contracts.engine import ResolvedModel
    from fleet.contracts.prompts import Prompt
    from fleet.contracts.sources import SyntheticSource
    from fleet.contracts.spec import ModelSpec, Sampling, Shard
    from fleet.results.scores import join_scores

    model = ResolvedModel(ModelSpec(name="m", source=SyntheticSource()), tmp_path, "w" * 16, None)
    sampling = Sampling(max_tokens=16, logprobs=5)
    cand = TestDoubleEngine(TestDoubleArgs(name="cand", logprob_shift=0.01), model, sampling=sampling)
    ref = TestDoubleEngine(TestDoubleArgs(name="ref"), model, sampling=sampling)
    gen = cand.generate(Shard("m", "cand", "p", 0, tuple(Prompt(id=str(i), prompt=f"q {i}") for i in range(128))))
    scored = join_scores(gen.tokens, ref.score(gen.requests, k=5))
    for tokens in (scored, gen.tokens):
        got = prompt_rows.summarize(tokens)
        assert parquet_bytes(got) == parquet_bytes(by_sort(tokens, kl_sum="group"))
    assert prompt_rows.summarize(scored.slice(0, 0)).equals(by_sort(scored.slice(0, 0)))


def test_null_keys_group_as_the_definition_groups_them() -> None:
    """Test fixtures leave model_weights out (null): a key like any other, sorted first."""
    tokens = shard(np.random.default_rng(1), 6, 4, 2)
    weights = pa.array([None if i % 3 else "w" for i in range(tokens.num_rows)], pa.string())
    tokens = tokens.set_column(1, "model_weights", weights)
    got = prompt_rows.summarize(tokens)
    assert got.equals(by_sort(tokens)) and got.column("model_weights").null_count  # Parquet would refuse it
    position = pa.array([None, *tokens.column("position").to_pylist()[1:]], pa.int32())
    with pytest.raises(ValueError, match="null 'position'"):
        prompt_rows.summarize(tokens.set_column(5, "position", position))
