"""The report's |dlogp| figures from the aggregates each shard writes (fleet/results/prompt_tails.py,
merged by fleet/analysis/from_tails.py) against the same figures from every position.

Tolerances (docs/metrics.md states them): TF max and p99 and the twin's p99 are the same floats;
the TF mean agrees to 1e-12 relative (the same sum, added in another order); the bootstrap interval
is the blocked bootstrap's, bit for bit, and so within 5 % of its width of the exact resampling a
small run gets (test_report_aggregates.py checks that bound). Where the tails cannot give a figure
exactly, the report reads the positions: never an estimate in its place.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from test_report_aggregates import FRAMES, _prompts

from fleet.analysis import bootstrap, from_stats, from_tails, linear_quantile
from fleet.analysis.noise_model import NoiseSpec
from fleet.report import figures
from fleet.results import prompt_tails, reader


def _load(run: Path) -> tuple[pl.DataFrame, pl.LazyFrame, str, NoiseSpec]:
    info = reader.read_info(run)
    scans = reader.load(run)
    return scans["requests"].collect(), scans["prompt_stats"], info.reference, NoiseSpec.from_info(info)


def _without_aggregates(stats: pl.LazyFrame) -> pl.LazyFrame:
    """prompt_stats as schema 5 wrote them: no aggregate columns (they read as nulls)."""
    schema = stats.collect_schema()
    return stats.with_columns(pl.lit(None, schema[c]).alias(c) for c in from_tails.COLUMNS)


def test_engine_run_figures_from_tails_are_those_from_every_position(
    engine_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo run (HF reference with its twin, vLLM fp32 and bf16): with the blocked bootstrap on
    both paths, the report's figures from the shards' aggregates are those from every position."""
    monkeypatch.setattr(bootstrap, "EXACT_MAX_VALUES", 0)  # the path of runs past 20,000 positions
    requests, stats, ref, spec = _load(engine_run)
    pairs = from_stats.Pairs.load(requests, stats, ref)
    prompt = pairs.cand["prompt"].to_numpy()
    for model_name, target, first, end, *_ in pairs.candidates():  # the tails give every figure here
        assert from_tails.figures(pairs.cand[first:end], prompt[first:end], spec, model_name, target) is not None
    merged = figures.from_prompt_stats(requests, stats, ref, spec)
    positions = figures.from_prompt_stats(requests, _without_aggregates(stats), ref, spec)
    for name, a, b in zip(FRAMES, positions, merged, strict=True):
        assert a.height, name
        assert_frame_equal(a, b, check_exact=False, rel_tol=1e-12, abs_tol=0.0)
    exact = ("tf_p99_abs_logprob_diff", "tf_max_abs_logprob_diff", "tf_excess_ci_low", "tf_excess_ci_high")
    assert_frame_equal(positions[0].select(exact), merged[0].select(exact), check_exact=True)


def test_engine_run_tails_within_tolerance_of_exact_resampling(engine_run: Path) -> None:
    """A small run's noise model resamples every value; from tails (forced, `exact_max=0`) its
    interval is the blocked one: endpoints within 5 % of the width, the rest the same figures."""
    requests, stats, ref, spec = _load(engine_run)
    pairs = from_stats.Pairs.load(requests, stats, ref)
    prompt = pairs.cand["prompt"].to_numpy()
    exact = figures.from_prompt_stats(requests, _without_aggregates(stats), ref, spec)[0]
    for model_name, target, first, end, *_ in pairs.candidates():
        found = from_tails.figures(pairs.cand[first:end], prompt[first:end], spec, model_name, target, exact_max=0)
        assert found is not None
        tf, noise = found
        row = exact.filter(pl.col("target") == target).row(0, named=True)
        for name in ("tf_p99_abs_logprob_diff", "tf_max_abs_logprob_diff", "twin_p99_abs_logprob_diff", "noise"):
            assert (tf | noise)[name] == row[name], name
        assert tf["tf_mean_abs_logprob_diff"] == pytest.approx(row["tf_mean_abs_logprob_diff"], rel=1e-12)
        width = row["tf_excess_ci_high"] - row["tf_excess_ci_low"]
        for end_name in ("tf_excess_ci_low", "tf_excess_ci_high"):
            assert abs(noise[end_name] - row[end_name]) <= 0.05 * width, (end_name, noise, row)


def _shards(values: np.ndarray, prompt: np.ndarray, per_shard: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(tail values, their prompts, the floor) as shards of `per_shard` prompts write them."""
    shard = prompt // per_shard
    floors = np.array([prompt_tails._floor(values[shard == s]) for s in range(int(shard.max()) + 1)])
    kept = values >= floors[shard]
    partial = np.bincount(shard, weights=kept) < np.bincount(shard)
    return values[kept], prompt[kept], float(floors[partial].max()) if partial.any() else 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tails_give_the_quantile_and_blocked_interval_bit_for_bit(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bootstrap, "EXACT_MAX_VALUES", 0)
    cand, twin, prompt = _prompts(np.random.default_rng(seed), 2500, (10, 40))
    blocks, units = bootstrap.block_of(np.arange(int(prompt.max()) + 1))  # each prompt's block
    n_block = np.bincount(blocks[prompt], minlength=units)
    tails = []
    for values in (cand, twin):
        kept, kept_prompt, floor = _shards(values, prompt, 20)
        tails.append(bootstrap.Tail(kept, blocks[kept_prompt], floor, len(values), n_block))
    assert tails[0].quantile(0.99) == linear_quantile.quantile(cand, 0.99)
    kw = {"twin_p99": 0.0, "allowance": 1.0, "quantile": 0.99, "resamples": 1000}
    assert bootstrap.tail_interval(tails[0], tails[1], units, **kw) == bootstrap.interval(cand, twin, prompt, **kw)


def test_a_shard_far_above_the_others_sends_the_quantile_back_to_the_positions() -> None:
    cand, _, prompt = _prompts(np.random.default_rng(3), 600, (10, 40))
    cand[prompt < 20] *= 1000  # one shard of 20 prompts: its floor is above the run's p99
    kept, kept_prompt, floor = _shards(cand, prompt, 20)
    tail = bootstrap.Tail(kept, kept_prompt, floor, len(cand), np.bincount(prompt).astype(float))
    assert tail.quantile(0.99) is None
    assert tail.quantile(0.9999) == linear_quantile.quantile(cand, 0.9999)  # its own top is complete
