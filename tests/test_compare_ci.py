"""fleet compare's intervals on the figures it resamples by prompt sums, task item and load prompt:
pearson_r, mae, kl_topk_mean, first_divergence_mean, accuracy_pct, task_accuracy_delta and the
parity-under-load figures. Each interval is checked against a plain loop that resamples the same
units with the same seed and recomputes the figure from the stored rows, and on hand-built runs
whose interval is known.

The runs are written by test_compare.write_run: prompts q000.. of three tokens, the reference
answering 5 8 9; a candidate drifts by (i % 4) / 16 x `drift` nats per prompt and, where asked,
diverges at position 1 (token 3: a wrong answer to "contains t8") or 2 (token 4: still right).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from test_compare import write_run
from test_perf import mixed_level

from fleet.analysis import bootstrap, parity, perf, perf_resample, throughput
from fleet.analysis.perf_resample import RESAMPLES
from fleet.contracts import perf_schema, schema, stored_tables
from fleet.contracts.gates import PERF_COLUMNS
from fleet.report import compare
from fleet.results import reader
from fleet.results.store import RunStore

REF = [(5, -0.25), (8, -0.5), (9, -1.0)]
WRONG = {1: (3, -0.75, -1.5), 2: (4, -1.0, -1.75)}  # the candidate's token at a divergence, its lp, the ref's TF lp
NEW = ["pearson_r", "mae", "kl_topk_mean", "first_divergence_mean"]


def _outputs(n: int, *, drift: float, diverge: dict[int, int]) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for i in range(n):
        shift = (i % 4) / 16 * drift
        tokens = [(tok, lp - shift, lp) for tok, lp in REF]
        if i in diverge:
            tokens[diverge[i]] = WRONG[diverge[i]]
        out[f"q{i:03d}"] = tokens
    return out


def _run(run_dir: Path, n: int, *, drift: float = 1.0, diverge: dict[int, int] | None = None) -> Path:
    expected = {f"q{i:03d}": json.dumps({"contains": "t8"}) for i in range(n)}
    reference = {f"q{i:03d}": list(REF) for i in range(n)}
    outputs = _outputs(n, drift=drift, diverge=diverge or {})
    return write_run(run_dir, {"cand": outputs}, reference=reference, expected=expected)


def _interval(values: list[float]) -> tuple[float, float]:
    """perf_resample.bounds, written out: the 2.5 and 97.5 % quantiles of the finite resamples."""
    finite = np.array([v for v in values if np.isfinite(v)])
    if len(finite) < 0.95 * len(values):
        return float("nan"), float("nan")
    return tuple(np.quantile(finite, [0.025, 0.975]))  # type: ignore[return-value]


def _loop_draws(n_a: int, n_b: int, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Indices of the drawn units, one resample at a time: run A's 2,000, then run B's."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_a, n_a) for _ in range(RESAMPLES)], [rng.integers(0, n_b, n_b) for _ in range(RESAMPLES)]


def _row(frame: pl.DataFrame, target: str, metric: str) -> dict[str, Any]:
    [row] = frame.filter((pl.col("target") == target) & (pl.col("metric") == metric)).to_dicts()
    return row


def test_draws_are_one_draw_at_a_time() -> None:
    """bootstrap.draws takes a block of rows from numpy at once: the same counts as `draw` row by row."""
    for units in (1, 7, 3001):  # 3001: several blocks of rows
        one, block = np.random.default_rng(5), np.random.default_rng(5)
        expected = np.stack([bootstrap.draw(one, units) for _ in range(700)])
        assert np.array_equal(bootstrap.draws(block, units, 700), expected), units
        assert one.integers(0, 1 << 30) == block.integers(0, 1 << 30)  # and the generator is where it was


def _per_prompt(run: Path) -> dict[str, list[np.ndarray]]:
    """Per prompt of `cand`, in key order, from the stored rows: its common-prefix (cand, ref) logprob
    pairs, its KL values (parity.kl_topk) and its first divergence (NaN: none)."""
    t = {name: frame.collect() for name, frame in reader.load(run).items() if name in ("requests", "tokens")}
    outputs = {(r["target"], r["prompt_id"]): r["output_token_ids"] for r in t["requests"].iter_rows(named=True)}
    kl = parity.kl_topk(t["tokens"], "ref")
    out: dict[str, list[np.ndarray]] = {"x": [], "y": [], "kl": [], "first": []}
    for pid in sorted({p for target, p in outputs if target == "cand"}):
        cand, ref = outputs[("cand", pid)], outputs[("ref", pid)]
        first = next((i for i, (c, r) in enumerate(zip(cand, ref, strict=True)) if c != r), None)
        rows = t["tokens"].filter(pl.col("prompt_id") == pid).sort("position")
        lp = {
            target: rows.filter(pl.col("target") == target)["logprob"].cast(pl.Float64).to_numpy()
            for target in ("cand", "ref")
        }
        end = len(cand) if first is None else first
        out["x"].append(lp["cand"][:end])
        out["y"].append(lp["ref"][:end])
        out["kl"].append(kl.filter(pl.col("prompt_id") == pid)["kl"].to_numpy())
        out["first"].append(np.array([np.nan if first is None else float(first)]))
    return out


def _figures(p: dict[str, list[np.ndarray]], drawn: np.ndarray) -> dict[str, float]:
    """The four figures of the drawn prompts, their rows concatenated (a prompt drawn twice counts twice)."""
    x, y, kl, first = (np.concatenate([p[name][i] for i in drawn]) for name in ("x", "y", "kl", "first"))
    flat = len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0
    diverged = first[~np.isnan(first)]
    return {
        "pearson_r": np.nan if flat else float(np.corrcoef(x, y)[0, 1]),
        "mae": float(np.abs(x - y).mean()),
        "kl_topk_mean": float(kl.mean()),
        "first_divergence_mean": float(diverged.mean()) if len(diverged) else np.nan,
    }


def test_parity_intervals_match_a_loop_over_resampled_prompts(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 9, diverge={0: 1, 2: 2, 4: 2, 6: 1, 7: 2})
    b = _run(tmp_path / "b", 11, drift=2.0, diverge={0: 2, 3: 1, 5: 1, 6: 1, 9: 2, 10: 1})
    frame = compare.compare(a, b)
    p_a, p_b = _per_prompt(a), _per_prompt(b)
    draws_a, draws_b = _loop_draws(9, 11)
    fig_a, fig_b = [_figures(p_a, d) for d in draws_a], [_figures(p_b, d) for d in draws_b]
    for metric in NEW:
        row = _row(frame, "cand", metric)
        low, high = _interval([fb[metric] - fa[metric] for fa, fb in zip(fig_a, fig_b, strict=True)])
        assert (row["delta_ci_low"], row["delta_ci_high"]) == (
            pytest.approx(low, rel=1e-9),
            pytest.approx(high, rel=1e-9),
        ), metric
        assert row["delta"] != 0 and low <= row["delta"] <= high, (metric, row)


def test_known_parity_intervals(tmp_path: Path) -> None:
    """A run against its own copy: every interval holds 0. A constant shift: the interval is the shift."""
    diverge = {1: 1, 3: 2, 5: 2, 6: 1}
    frame = compare.compare(_run(tmp_path / "a", 8, diverge=diverge), _run(tmp_path / "copy", 8, diverge=diverge))
    for metric in NEW:
        row = _row(frame, "cand", metric)
        # pearson_r: the two runs' rows summed in another order (1e-16 apart)
        assert row["delta"] == pytest.approx(0, abs=1e-12), (metric, row)
        assert row["delta_ci_low"] < 0 < row["delta_ci_high"], (metric, row)
    # Four tokens. A: no drift, every prompt diverging at position 2; B: every token 1/16 nats lower
    # (r is 1 in both), every prompt diverging at 3. Each resample's figures are the run's: a point.
    reference = [*REF, (6, -0.75)]

    def constant(run_dir: Path, shift: float, at: int) -> Path:
        out = [(tok, lp - shift, lp) for tok, lp in reference[:at]] + [(4, -1.0, -1.75)] + [(7, -1.0, -1.25)] * (3 - at)
        prompts = [f"q{i:03d}" for i in range(8)]
        return write_run(run_dir, {"cand": dict.fromkeys(prompts, out)}, reference=dict.fromkeys(prompts, reference))

    frame = compare.compare(constant(tmp_path / "flat", 0.0, 2), constant(tmp_path / "shifted", 1 / 16, 3))
    for metric, delta in (("mae", 1 / 16), ("first_divergence_mean", 1.0), ("pearson_r", 0.0)):
        row = _row(frame, "cand", metric)
        assert row["delta"] == pytest.approx(delta, abs=1e-12), metric
        assert row["delta_ci_low"] == pytest.approx(delta, abs=1e-12) == row["delta_ci_high"], (metric, row)


def test_a_figure_one_run_lacks_has_no_interval(tmp_path: Path) -> None:
    """first_divergence_mean is null when no prompt diverged: nothing to resample on that side."""
    frame = compare.compare(_run(tmp_path / "a", 6), _run(tmp_path / "b", 6, diverge={2: 1}))
    row = _row(frame, "cand", "first_divergence_mean")
    assert row["a"] is None and row["delta_ci_low"] is None and row["delta_ci_high"] is None


def test_task_accuracy_intervals_match_a_loop_over_resampled_items(tmp_path: Path) -> None:
    """A: the candidate answers 2 of 9 items wrong (a divergence at position 1), B: 5 of 10; a
    divergence at position 2 leaves the answer right. The reference answers every item right."""
    a = _run(tmp_path / "a", 9, diverge={0: 1, 3: 1, 5: 2})
    b = _run(tmp_path / "b", 10, diverge={1: 1, 2: 1, 4: 1, 7: 1, 8: 1, 9: 2})
    wrong_a, wrong_b = {0, 3}, {1, 2, 4, 7, 8}
    correct_a = np.array([i not in wrong_a for i in range(9)], dtype=float)
    correct_b = np.array([i not in wrong_b for i in range(10)], dtype=float)
    frame = compare.compare(a, b)
    draws_a, draws_b = _loop_draws(9, 10)
    # The reference is right on every drawn item: the delta in points is the candidate's accuracy - 100.
    acc_a, acc_b = ([100 * c[d].mean() for d in ds] for c, ds in ((correct_a, draws_a), (correct_b, draws_b)))
    deltas = [y - x for x, y in zip(acc_a, acc_b, strict=True)]
    for metric in ("accuracy_pct", "task_accuracy_delta"):
        row = _row(frame, "cand", metric)
        assert row["delta"] == pytest.approx(100 * (5 / 10 - 7 / 9))
        low, high = _interval(deltas)
        assert (row["delta_ci_low"], row["delta_ci_high"]) == (pytest.approx(low), pytest.approx(high)), metric
        assert low < row["delta"] < high
    # The reference's own accuracy: 100 % on every resample of both runs; its delta to itself 0.
    ref = _row(frame, "ref", "accuracy_pct")
    assert (ref["delta"], ref["delta_ci_low"], ref["delta_ci_high"]) == (0.0, 0.0, 0.0)


def _add_load(run: Path, scratch: Path, levels: dict[int, tuple[set[int], set[int]]], n: int) -> None:
    """Load parity rows for `cand` at each level: (prompts diverging alone, prompts diverging under
    load), each divergence at position 1; the rows are those write_run writes for such a candidate."""
    store = RunStore(run)
    at = {"scenario": pl.lit("decode"), "in_flight_sent": pl.lit(1)}
    written: dict[frozenset[int], Path] = {}  # one scratch run per set of diverging prompts
    for level, phases in levels.items():
        runs = {}
        for phase, diverged in zip(perf_schema.LOAD_PHASES, phases, strict=True):
            key = frozenset(diverged)
            if key not in written:
                written[key] = _run(scratch / str(len(written)), n, diverge=dict.fromkeys(diverged, 1))
            runs[phase] = written[key]
        for name in ("requests", "tokens"):
            parts = []
            for phase, rows in runs.items():
                frame = reader.load(rows)[name].filter(pl.col("target") == "cand").collect()
                parts.append(frame.with_columns(**at, level=pl.lit(level, pl.Int32), phase=pl.lit(phase)))
            table = schema.conform(pl.concat(parts).to_arrow(), stored_tables.all_tables()[f"load_{name}"])
            store.write(f"load_{name}", f"m/cand/decode/{level:05d}", table)


def test_load_parity_intervals_match_a_loop_over_resampled_prompts(tmp_path: Path) -> None:
    """real divergences under load from the reference (load_real_divergences: the most at any level)
    and from the same prompts alone (load_batch_real_divergences), each run's 10 prompts resampled
    once for both levels."""
    n = 10
    a, b = _run(tmp_path / "a", n), _run(tmp_path / "b", n)
    # level -> (diverging alone, diverging under load)
    load_a = {1: (set(), {2}), 4: ({2}, {2, 5})}
    load_b = {1: ({1}, {1, 3}), 4: ({1}, {1, 3, 6, 8, 9})}
    _add_load(a, tmp_path / "scratch-a", load_a, n)
    _add_load(b, tmp_path / "scratch-b", load_b, n)
    frame = compare.compare(a, b)
    draws_a, draws_b = _loop_draws(n, n)

    def counts(load: dict[int, tuple[set[int], set[int]]], drawn: np.ndarray) -> tuple[int, int]:
        real = max(int(np.isin(drawn, list(under)).sum()) for _, under in load.values())
        vs_solo = max(int(np.isin(drawn, list(under ^ alone)).sum()) for alone, under in load.values())
        return real, vs_solo

    fig_a, fig_b = [counts(load_a, d) for d in draws_a], [counts(load_b, d) for d in draws_b]
    everyone = np.arange(n)
    for column, metric in enumerate(("load_real_divergences", "load_batch_real_divergences")):
        row = _row(frame, "cand", metric)
        assert (row["a"], row["b"]) == (counts(load_a, everyone)[column], counts(load_b, everyone)[column])
        low, high = _interval([fb[column] - fa[column] for fa, fb in zip(fig_a, fig_b, strict=True)])
        assert (row["delta_ci_low"], row["delta_ci_high"]) == (low, high), metric
        assert low <= row["delta"] <= high and high > low


def test_perf_counts_goodput_and_parity_latencies_drawn_once_are_the_reports() -> None:
    """Every perf figure compare resamples (n_errors, goodput and SLO share with the others) and the
    parity runs' latency quantiles: each request drawn once gives perf.summary's / throughput.throughput's."""
    requests, levels = mixed_level()
    slos = {"s": {"e2e_s": 0.7, "ttft_s": None, "tpot_s": None}}
    [expected] = perf.summary(requests, levels, slos).to_dicts()
    assert 0 < expected["slo_share"] < 1 and expected["n_errors"] == 1
    [level] = perf_resample.levels(requests, levels, slos=slos).values()
    once = np.ones((1, level.n_requests), dtype=np.int64)
    for column in PERF_COLUMNS:
        assert level.figure(column, once)[0] == pytest.approx(expected[column], rel=1e-12), column
    # Without an SLO the goodput figures are null, and so is every resample of them.
    [no_slo] = perf_resample.levels(requests, levels).values()
    assert np.isnan(no_slo.figure("goodput_qps", once)).all()

    parity_requests = pl.DataFrame(
        [
            {"model": "m", "target": "t", "prompt_set": "s", "prompt_id": f"p{i}", "ttft_s": 0.01 * (i % 3 + 1)}
            | {"tpot_s": None if i == 2 else 0.002 * i, "e2e_s": 0.1 * i, "n_prompt_tokens": 4, "n_output_tokens": 3}
            for i in range(7)
        ]
    )
    shards = pl.DataFrame({"model": ["m"], "target": ["t"], "n_output_tokens": [21], "wall_s": [1.0]})
    [measured] = throughput.throughput(parity_requests, shards).to_dicts()
    [run] = perf_resample.parity_runs(parity_requests).values()
    once = np.ones((1, 7), dtype=np.int64)
    for column in perf_resample.PARITY_LATENCIES:
        assert run.figure(column, once)[0] == pytest.approx(measured[column], rel=1e-12), column


def test_self_consistency_intervals_match_a_loop_over_resampled_prompts(tmp_path: Path) -> None:
    """Two matrix variants of one base differing in one setting: eager-false leaves eager-true's
    greedy path (a real divergence: 1 nat apart, not in each other's top-1) on the given prompts."""
    variants = {
        "v.eager-true": {"base": "v", "settings": {"enforce_eager": True}},
        "v.eager-false": {"base": "v", "settings": {"enforce_eager": False}},
    }
    n = 10

    def matrix_run(run_dir: Path, parting: set[int]) -> Path:
        same, parted = _outputs(n, drift=0.0, diverge={}), _outputs(n, drift=0.0, diverge=dict.fromkeys(parting, 1))
        reference = {f"q{i:03d}": list(REF) for i in range(n)}
        run = write_run(run_dir, {"v.eager-true": same, "v.eager-false": parted}, reference=reference)
        store = RunStore(run)
        store.update_info(manifest_resolved=store.info()["manifest_resolved"] | {"variants": variants})
        return run

    parting_a, parting_b = {1, 4}, {0, 2, 5, 7, 9}
    frame = compare.compare(matrix_run(tmp_path / "a", parting_a), matrix_run(tmp_path / "b", parting_b))
    draws_a, draws_b = _loop_draws(n, n)
    deltas = [
        np.isin(b, list(parting_b)).sum() - np.isin(a, list(parting_a)).sum()
        for a, b in zip(draws_a, draws_b, strict=True)
    ]
    low, high = _interval(deltas)
    for variant in variants:
        row = _row(frame, variant, "consistency_real_divergences")
        assert (row["a"], row["b"]) == (2, 5)
        assert (row["delta_ci_low"], row["delta_ci_high"]) == (low, high)
        assert low < row["delta"] < high
