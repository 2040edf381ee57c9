"""The report's figures from prompt_stats (what each shard now writes beside its token rows) agree
with the same figures from the token rows, and runs without prompt_stats still report.

Tolerances (docs/results.md states them): every figure of parity, first step, divergences and
sequences agrees to 1e-9 relative (only the order of floating-point additions differs; p99s are
exact quantiles of the same values); the noise model's bootstrap interval is the same resampling,
bit for bit, up to bootstrap.EXACT_MAX_VALUES values per candidate, and past it (blocks of prompts,
log-binned) its endpoints lie within 5 % of the interval's width of the exact bootstrap.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal
from test_compare import DIVERGED, SAME, write_run

from fleet.analysis import aligned, bootstrap, from_stats, key_blocks, linear_quantile, parity, stats_divergences
from fleet.analysis.noise_model import NoiseSpec
from fleet.contracts import schema
from fleet.report import figures
from fleet.report.model import RunReport
from fleet.results import prompt_rows, reader
from fleet.results.store import RunStore

FRAMES = ("parity", "first step", "divergences", "sequences")


def both_paths(run: Path) -> tuple[figures.Figures, figures.Figures]:
    info = reader.read_info(run)
    scans = reader.load(run)
    requests, spec = scans["requests"].collect(), NoiseSpec.from_info(info)
    exact = figures.from_token_rows(requests, scans["tokens"], info.reference, spec)
    return exact, figures.from_prompt_stats(requests, scans["prompt_stats"], info.reference, spec)


def assert_same_figures(run: Path) -> None:
    exact, merged = both_paths(run)
    for name, a, b in zip(FRAMES, exact, merged, strict=True):
        assert a.height, name
        assert_frame_equal(a, b, check_exact=False, rel_tol=1e-9, abs_tol=1e-12)


def test_engine_run_figures_from_prompt_stats_equal_token_figures(engine_run: Path) -> None:
    """The real run (HF reference with its precision twin, vLLM fp32 and bf16 candidates, near ties)."""
    assert reader.covers(engine_run, "prompt_stats", "tokens")  # the driver wrote them, one per shard
    assert_same_figures(engine_run)
    report = RunReport.build(engine_run)
    assert set(report.parity["target"]) == {"vllm-fp32", "vllm-bf16"}
    assert report.parity["tf_excess_ci_low"].is_not_null().all()


def divergences_of(run: Path, *, flat_lists: bool) -> pl.DataFrame:
    """stats_divergences.divergences; without `flat_lists`, as on a run of schema 4 (no ref_top1_ids nor
    ref_top1_in_topk): every divergence then reads the candidate's top-k list there."""
    info = reader.read_info(run)
    scans = reader.load(run)
    requests, stats, spec = scans["requests"].collect(), scans["prompt_stats"], NoiseSpec.from_info(info)
    if not flat_lists:
        nulls = {"ref_top1_ids": pl.List(pl.Int32), "ref_top1_in_topk": pl.List(pl.Boolean)}
        # Nor the values at the top-1 split (schema 6): every divergence reads the lists.
        nulls |= {"top1_split": pl.Int32, "split_ref_top1_id": pl.Int32, "split_ref_top1_in_topk": pl.Boolean}
        stats = stats.with_columns(pl.lit(None, dtype).alias(name) for name, dtype in nulls.items())
    pairs = from_stats.Pairs.load(requests, stats, info.reference)
    _, table, _ = from_stats.figures(pairs, from_stats.first_step(pairs), spec)
    return stats_divergences.divergences(pairs, stats, spec, table)


def test_engine_run_divergences_from_flat_lists_equal_those_from_topk_lists(engine_run: Path) -> None:
    """From the values at each prompt's top-1 split (schema 6), and from the top-k lists alone."""
    flat = divergences_of(engine_run, flat_lists=True)
    assert flat["first_divergence"].is_not_null().any()  # bfloat16 leaves the reference's path somewhere
    assert_frame_equal(flat, divergences_of(engine_run, flat_lists=False))


def add_prompt_stats(run: Path) -> None:
    """prompt_stats for each tokens file, as the writer makes them."""
    store = RunStore(run)
    for file in sorted((run / "tokens").glob("**/*.parquet")):
        model_dir, _, target_dir, name = file.relative_to(run / "tokens").parts
        prompt_set, chunk = name.removesuffix(".parquet").rsplit("-", 1)
        shard = f"{model_dir.split('=')[1]}/{target_dir.split('=')[1]}/{prompt_set}/{chunk}"
        store.write("prompt_stats", shard, prompt_rows.summarize(pq.read_table(file)))


def test_a_run_without_prompt_stats_reports_from_token_rows(tmp_path: Path) -> None:
    run = write_run(tmp_path / "old", {"cand": DIVERGED, "cand2": SAME})
    assert not reader.covers(run, "prompt_stats", "tokens")
    before = RunReport.build(run)
    add_prompt_stats(run)
    assert reader.covers(run, "prompt_stats", "tokens")
    after = RunReport.build(run)
    assert_frame_equal(before.parity, after.parity, check_exact=False, rel_tol=1e-9)
    assert_frame_equal(before.sequences, after.sequences)
    assert_same_figures(run)


def test_prompt_stats_of_schema_4_report_the_same_figures(tmp_path: Path) -> None:
    """Files from before ref_top1_ids and ref_top1_in_topk read as nulls: the top-k lists decide."""
    run = write_run(tmp_path / "v4", {"cand": DIVERGED, "cand2": SAME})
    add_prompt_stats(run)
    for file in (run / "prompt_stats").glob("**/*.parquet"):
        table = pq.read_table(file).drop_columns(["ref_top1_ids", "ref_top1_in_topk"])
        pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"fleet.schema_version": b"4"}), file)
    assert schema.SCHEMA_VERSION != 4
    assert_same_figures(run)
    assert_frame_equal(divergences_of(run, flat_lists=True), divergences_of(run, flat_lists=False))


def test_prompts_without_a_request_pair_by_joins(tmp_path: Path) -> None:
    """A candidate prompt with prompt_stats but no request row (a damaged or hand-edited run): its
    stats rows are not one to one with the paired prompts, and the figures (first step included,
    by a join then) are still those of the token rows."""
    run = write_run(tmp_path / "gap", {"cand": DIVERGED, "cand2": SAME})
    add_prompt_stats(run)
    file = next(f for f in (run / "requests").glob("**/*.parquet") if "target=cand2" in str(f))
    table = pq.read_table(file)
    kept = pl.from_arrow(table).filter(pl.col("prompt_id") != "p1").to_arrow().cast(table.schema)
    pq.write_table(kept, file)
    info = reader.read_info(run)
    scans = reader.load(run)
    pairs = from_stats.Pairs.load(scans["requests"].collect(), scans["prompt_stats"], info.reference)
    assert not pairs.one_to_one
    assert_same_figures(run)


def test_partial_prompt_stats_are_not_used(tmp_path: Path) -> None:
    """A run resumed across versions has prompt_stats for some shards only: the token rows decide."""
    run = write_run(tmp_path / "mixed", {"cand": DIVERGED})
    add_prompt_stats(run)
    next((run / "prompt_stats").glob("**/*.parquet")).unlink()
    assert not reader.covers(run, "prompt_stats", "tokens")
    assert RunReport.build(run).parity.height == 1


def _prompts(rng: np.random.Generator, n: int, lengths: tuple[int, int]) -> tuple[np.ndarray, ...]:
    sizes = rng.integers(*lengths, n)
    scale = np.repeat(rng.lognormal(0, 0.5, n), sizes)  # prompts differ, as real ones do
    cand, twin = np.abs(rng.normal(0, 0.05, sizes.sum())) * scale, np.abs(rng.normal(0, 0.045, sizes.sum())) * scale
    return cand, twin, np.repeat(np.arange(n), sizes)


def _old_interval(cand: list[np.ndarray], twin: list[np.ndarray], allowance: float) -> tuple[float, float]:
    """The loop the noise model ran before: concatenate each resample, take its quantiles."""
    rng, ratios = np.random.default_rng(0), []
    for _ in range(1000):
        pick = rng.integers(0, len(cand), len(cand))
        c = np.quantile(np.concatenate([cand[i] for i in pick]), 0.99)
        t = np.quantile(np.concatenate([twin[i] for i in pick]), 0.99)
        ratios.append(c / (t * allowance))
    low, high = np.quantile(ratios, [0.025, 0.975])
    return float(low), float(high)


def test_bootstrap_is_the_resample_loop_bit_for_bit() -> None:
    cand, twin, prompt = _prompts(np.random.default_rng(1), 40, (1, 40))
    cand[prompt == 3] = 0.0  # exact zeros, as identical float32 logprobs give
    split = np.cumsum(np.bincount(prompt))[:-1]
    old = _old_interval(np.split(cand, split), np.split(twin, split), 2.0)
    new = bootstrap.interval(cand, twin, prompt, twin_p99=0.0, allowance=2.0, quantile=0.99, resamples=1000)
    assert new == old


@pytest.mark.parametrize("seed", [0, 1])
def test_block_bootstrap_agrees_with_the_prompt_bootstrap(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past EXACT_MAX_VALUES: 1,000 blocks of prompts, log-binned; endpoints within 5 % of the width."""
    cand, twin, prompt = _prompts(np.random.default_rng(seed), 2500, (10, 40))
    kw = {"twin_p99": 0.0, "allowance": 1.0, "quantile": 0.99, "resamples": 1000}
    monkeypatch.setattr(bootstrap, "EXACT_MAX_VALUES", len(cand))
    exact = np.array(bootstrap.interval(cand, twin, prompt, **kw))
    monkeypatch.setattr(bootstrap, "EXACT_MAX_VALUES", 0)
    blocks = np.array(bootstrap.interval(cand, twin, prompt, **kw))
    assert np.abs(blocks - exact).max() <= 0.05 * (exact[1] - exact[0]), (exact, blocks)


def _binned_definition(values: np.ndarray, block: np.ndarray, units: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Per-block histograms as bootstrap._Binned defines them: each value's log bin; column 0 holds
    the zeros and every bin under the pooled median's (the zeros alone when they are over half);
    (histograms, each column's lowest value, whether column 0 is zeros alone)."""
    bins = bootstrap.log_bins(values).astype(np.int64)
    positive = np.sort(np.unique(bins[values.astype(np.float32) > 0]))
    zeros = int((bins == bootstrap._ZERO_BIN).sum())
    exact_zeros = zeros > len(values) * 0.5
    if exact_zeros or not positive.size:
        first = int(positive[0]) if positive.size else 0
    else:
        counts = np.array([zeros] + [int((bins == b).sum()) for b in positive])
        first = int(positive[np.searchsorted(np.cumsum(counts), len(values) * 0.5, side="right") - 1])
    column = np.maximum(bins - (first - 1), 0)
    hist = np.zeros((units, int(column.max()) + 1))
    np.add.at(hist, (block, column), 1)
    low = np.exp2((first + np.arange(hist.shape[1]) - 1) / bootstrap.BINS_PER_OCTAVE)
    return hist, low, exact_zeros


@pytest.mark.parametrize("zeros", [0.0, 0.3, 0.7, 1.0])
def test_block_histograms_are_their_definition(zeros: float) -> None:
    """_Binned's one-pass histograms equal the definition: zeros under or over half the values,
    none, all; values across 60 octaves, float32 denormals among them."""
    rng = np.random.default_rng(3)
    values = np.exp2(rng.uniform(-140, -80, 50_000)) * rng.random(50_000)
    values[:25_000] = np.abs(rng.standard_t(3, 25_000)) * 0.05
    values[rng.random(len(values)) < zeros] = 0.0
    block = rng.integers(0, 37, len(values))
    binned = bootstrap._Binned(values, block, 37)
    hist, low, exact_zeros = _binned_definition(values, block, 37)
    assert binned.exact_zeros == exact_zeros
    np.testing.assert_array_equal(binned.hist, hist)
    np.testing.assert_array_equal(binned.low, low)


def test_quantile_is_numpys_bit_for_bit() -> None:
    """linear_quantile.quantile selects among the values above a sampled bound: the same float as
    numpy.quantile, with ties, zeros, sorted input and the quantiles at either end."""
    rng = np.random.default_rng(2)
    n = linear_quantile._SELECT_MIN + 1000
    arrays = [np.abs(rng.standard_t(3, n)), rng.integers(0, 3, n).astype(float), np.zeros(n), np.sort(rng.random(n))]
    arrays.append(rng.random(n).astype(np.float32))  # float32 logprob differences as stored
    for values in arrays:
        for q in (0.0, 0.01, 0.5, 0.99, 0.999, 1.0):
            assert linear_quantile.quantile(values, q) == float(np.quantile(values, q)), (values[:3], q)


def test_sequences_compare_lists_as_the_definition_says() -> None:
    """Positions past the shorter output count as mismatches; a null output is an empty one."""
    outputs = {"a": ([1, 2, 3], [1, 2, 4]), "b": ([1, 2], [1, 2, 3]), "c": ([], []), "d": (None, [5]), "e": ([7], [7])}
    rows = [
        {"model": "m", "target": target, "prompt_set": "s", "prompt_id": pid, "output_token_ids": ids}
        for pid, pair in outputs.items()
        for target, ids in zip(("ref", "cand"), pair, strict=True)
    ]
    frame = pl.DataFrame(rows, schema_overrides={"output_token_ids": pl.List(pl.Int32)})
    seq = parity.sequences(frame, "ref").select("prompt_id", "exact_match", "tokens_matched", "first_divergence")
    assert seq.rows() == [
        ("a", False, 2, 2),
        ("b", False, 2, 2),
        ("c", True, 0, None),
        ("d", False, 0, 0),
        ("e", True, 1, None),
    ]


def test_compare_rows_is_the_position_by_position_definition() -> None:
    """aligned.compare_rows on seeded lists (short alphabets: long shared prefixes, nulls, empty
    lists, pairs in any order and rows used twice) equals the Python loop over positions."""
    rng = np.random.default_rng(5)
    lists = [None if rng.random() < 0.05 else list(rng.integers(0, 3, rng.integers(0, 12))) for _ in range(600)]
    cand, ref = rng.permutation(600)[:300], rng.integers(0, 600, 300)
    found = aligned.compare_rows(aligned.Lists(pl.Series(lists, dtype=pl.List(pl.Int32))), cand, ref)
    for i, (c, r) in enumerate(zip(cand, ref, strict=True)):
        a, b = lists[c] or [], lists[r] or []
        same = [x == y for x, y in zip(a, b, strict=False)]
        first = next((p for p, ok in enumerate(same) if not ok), len(same) if len(a) != len(b) else -1)
        assert (found["tokens_matched"][i], found["first_divergence"][i]) == (sum(same), first), (a, b)
        assert (found["n_cand"][i], found["n_ref"][i]) == (len(a), len(b))


def test_candidate_blocks_of_no_rows_are_none() -> None:
    """A report asked before any candidate row is stored (003's `after:` check on a parity: false
    stage) finds no blocks, rather than one that ends at row 0."""
    from fleet.analysis import from_stats

    empty = pl.DataFrame({c: pl.Series([], dtype=pl.String) for c in from_stats.RUN})
    assert key_blocks.runs(empty).height == 0
    two = pl.DataFrame({c: ["a", "a", "b"] for c in from_stats.RUN})
    assert key_blocks.runs(two).select("first", "end").rows() == [(0, 2), (2, 3)]
