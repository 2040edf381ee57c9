"""The per-prompt tables' picks (divergence.worst, figures.worst_first_steps) against their rule
written as a stable sort of every row and the first N of each candidate, on seeded random frames
full of ties and nulls: the picks partition one number per row, or sort row numbers only."""

from __future__ import annotations

import random

import polars as pl
import pytest

from fleet.analysis import divergence
from fleet.analysis.parity import CAND
from fleet.report import figures

KINDS = [None, "divergence", "near tie", "identical"]


def _frames(seed: int, *, huge: bool = False) -> tuple[pl.DataFrame, pl.DataFrame]:
    rng = random.Random(seed)
    rows = []
    for model in ["a", "b"][: rng.randint(1, 2)]:
        for target in ["x", "y", "z"][: rng.randint(1, 3)]:
            for i in range(rng.randint(0, 40)):
                matched = rng.choice([None, 3, 4, rng.randint(0, 9), *([1 << 40] if huge else [])])
                rows.append(
                    {"model": model, "target": target, "prompt_set": "s", "prompt_id": f"p{i:03d}",
                     "first_divergence": rng.choice([None, 0, 1, 2, rng.randint(0, 9)]), "tokens_matched": matched,
                     "rel_err": rng.choice([None, 0.0, 0.5, float("nan"), float("inf"), rng.random()])}
                )  # fmt: skip
    schema = dict.fromkeys(CAND, pl.String) | {"first_divergence": pl.Int64, "tokens_matched": pl.Int64}
    seqs = pl.DataFrame(rows, schema=schema | {"rel_err": pl.Float64})
    kinds = pl.Series([rng.choice(KINDS) for _ in range(seqs.height)], dtype=pl.String)
    per_prompt = seqs.select(CAND).with_columns(kind=kinds, ref_margin=pl.lit(0.1), noise=pl.lit(0.2))
    return seqs, per_prompt


def _worst_by_rule(seqs: pl.DataFrame, per_prompt: pl.DataFrame, top: int) -> pl.DataFrame:
    kind = pl.col("kind").replace_strict({"divergence": 0, "near tie": 1}, default=2, return_dtype=pl.Int8)
    joined = seqs.drop("rel_err").hstack(per_prompt.select("kind", "ref_margin", "noise"))
    ranked = joined.with_row_index("_row").sort(
        "model", "target", kind, "first_divergence", "tokens_matched", "_row", nulls_last=True
    )
    return ranked.group_by("model", "target", maintain_order=True).head(top).drop("_row").sort(CAND)


def test_no_candidate_prompt_picks_none() -> None:  # a stage gate read before any candidate row
    seqs, per_prompt = (frame.clear() for frame in _frames(1))
    assert divergence.worst(seqs.drop("rel_err"), per_prompt, 20).height == 0
    assert figures.worst_first_steps(seqs.select(*CAND, "rel_err"), 20).height == 0


@pytest.mark.parametrize("seed", range(40))
def test_worst_picks_what_sorting_every_row_picks(seed: int) -> None:
    seqs, per_prompt = _frames(seed, huge=seed % 10 == 0)  # some past the packing: the sort path
    for top in (1, 2, 5, 50):
        picked = divergence.worst(seqs.drop("rel_err"), per_prompt, top)
        assert picked.equals(_worst_by_rule(seqs, per_prompt, top)), (seed, top)


@pytest.mark.parametrize("seed", range(20))
def test_worst_first_steps_pick_the_largest_errors_earlier_rows_first(seed: int) -> None:
    first = _frames(seed)[0].select(*CAND, "rel_err")
    for top in (1, 3, 50):
        # Descending, NaN above every number (Polars' order), nulls last, ties to the earlier row.
        by_rule = (
            first.with_row_index("_row")
            .sort("rel_err", "_row", descending=[True, False], nulls_last=True)
            .group_by("model", "target", maintain_order=True)
            .head(top)
            .drop("_row")
            .sort(figures.CANDIDATE)
        )
        assert figures.worst_first_steps(first, top).equals(by_rule), (seed, top)
