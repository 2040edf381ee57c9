"""Gates against an earlier run (fleet/analysis/baseline.py), `fleet compare`'s intervals and
`fleet runs --trend` (fleet/analysis/trend.py).

Most runs here are built by hand (test_compare.write_run, `hf` target kinds, so a gate can pass)
with perf rows whose per-token pace is drawn per request around a set value (2 % spread): a
healthy repeat is the same pace drawn again, a regression the pace of a 5 % lower throughput.
The acceptance test at the end runs the labelled test double through Ray and the real load
generator at a set pace (actors/test_double.py), three runs into one results root.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from pydantic import ValidationError
from test_compare import SAME, _table, write_run
from test_perf import _request, mixed_level

from fleet import cli
from fleet.analysis import gates, perf, perf_resample
from fleet.analysis.baseline import RunBaselines
from fleet.contracts import perf_schema
from fleet.contracts.gates import RESAMPLED, Gate
from fleet.report import compare
from fleet.report.model import RunReport
from fleet.results import reader
from fleet.results.store import RunStore

KEY = {"model": "m", "model_weights": "0123456789abcdef", "target": "cand", "scenario": "decode"}
PACE = 0.02  # seconds per token of a healthy run
TOKENS = 16
DROP = 0.95  # the regression: 5 % lower throughput
GATE = {"metric": "perf_output_tok_s", "scenario": "decode", "level": 4, "op": ">=", "ratio": 0.97}


def perf_run(
    root: Path,
    run_id: str,
    *,
    started: str,
    pace: float = PACE,
    seed: int = 0,
    verdict: str | None = None,
    level: int = 4,
    spread: float = 0.02,
) -> Path:
    """A complete run of `cand` with 32 requests at `level`, each at a per-token pace drawn around
    `pace` (`spread`, 2 % by default); the level's wall is the requests' summed e2e over the level,
    as a level with busy slots takes. `verdict` is what `fleet run` would have recorded."""
    run = write_run(root / run_id, {"cand": SAME})
    rng = np.random.default_rng(seed)
    key = KEY | {"level": level}
    rows = []
    for i in range(32):
        gap = pace * (1 + spread * rng.normal())
        rows.append(_request(i, gap, [gap] * (TOKENS - 1), TOKENS * gap) | key)
    store = RunStore(run)
    shard = f"m/cand/decode/{level:05d}"
    store.write("perf_requests", shard, _table(perf_schema.PERF_REQUESTS, rows))
    wall = sum(r["e2e_s"] for r in rows) / level
    level_row = key | {"wall_s": wall, "n_requests": 32, "n_errors": 0, "hostname": "node-1"}
    store.write("perf_levels", shard, _table(perf_schema.PERF_LEVELS, [level_row]))
    store.update_info(started_at=f"2026-12-01T00:00:{started}.000+00:00", **({"gates": verdict} if verdict else {}))
    return run


def verdict(run: Path, **spec: Any) -> dict[str, Any]:
    verdicts = RunReport.build(run, gates=[Gate.model_validate(GATE | spec)]).verdicts
    assert verdicts is not None and verdicts.height == 1
    return verdicts.row(0, named=True)


def test_a_5pc_drop_fails_and_healthy_repeats_pass(tmp_path: Path) -> None:
    """The acceptance rule on hand-built runs, over 10 draws of each: a healthy repeat passes
    (its interval holds 1), a 5 % lower throughput fails (its whole interval is below 0.97)."""
    perf_run(tmp_path, "base", started="01", verdict="PASS")
    healthy = verdict(perf_run(tmp_path, "healthy", started="02", seed=1), baseline="latest-pass")
    slow = verdict(perf_run(tmp_path, "slow", started="02", seed=1, pace=PACE / DROP), baseline="base")
    assert healthy["verdict"] == "PASS" and healthy["baseline_run"] == "base", healthy
    assert healthy["ci_low"] < 1 < healthy["ci_high"]
    assert slow["verdict"] == "FAIL" and slow["ci_high"] < 0.97, slow
    assert slow["value"] / slow["baseline"] == pytest.approx(DROP, abs=0.01)
    assert "95 % CI [" in slow["reason"] and "no value in it is >= 0.97" in slow["reason"]
    # More draws of both, judged on the perf rows alone (no parity report): the margin is no accident.
    gate = Gate.model_validate(GATE | {"baseline": "base"})
    for seed in range(2, 8):
        for pace, expected in ((PACE, "PASS"), (PACE / DROP, "FAIL")):
            run = perf_run(tmp_path, f"r{seed}-{expected}", started="03", seed=seed, pace=pace)
            tables = {name: frame.collect() for name, frame in reader.load(run).items() if name.startswith("perf_")}
            runs = RunBaselines(run, reader.read_info(run), tables["perf_requests"], tables["perf_levels"])
            measured = perf.summary(tables["perf_requests"], tables["perf_levels"])["output_tok_s"][0]
            assert runs.judge(gate, "m", "cand", measured)["verdict"] == expected, (seed, expected)


def test_latest_pass_is_the_newest_earlier_passing_run(tmp_path: Path) -> None:
    perf_run(tmp_path, "a", started="01", verdict="PASS")
    perf_run(tmp_path, "b", started="02", verdict="FAIL")
    perf_run(tmp_path, "c", started="03", verdict="PASS")
    perf_run(tmp_path, "later", started="09", verdict="PASS")  # started after the judged run: never its baseline
    perf_run(tmp_path, "other-level", started="04", verdict="PASS", level=8)
    judged = perf_run(tmp_path, "judged", started="05")
    assert verdict(judged, baseline="latest-pass")["baseline_run"] == "other-level"
    missing_level = verdict(judged, baseline="latest-pass")
    assert missing_level["verdict"] == "FAIL"
    assert missing_level["reason"] == "baseline run other-level has no perf_output_tok_s for m/cand decode @ 4"
    assert verdict(judged, baseline="a")["baseline_run"] == "a"
    named = verdict(judged, baseline="c")
    assert (named["verdict"], named["baseline_run"]) == ("PASS", "c")
    unknown = verdict(judged, baseline="zz")
    assert unknown["verdict"] == "FAIL"
    assert f"baseline run zz is not in {tmp_path} (5 runs there: a, b, c, other-level, later)" == unknown["reason"]


def test_no_earlier_passing_run_skips_with_a_note(tmp_path: Path) -> None:
    """A series' first run has nothing to compare with: SKIP, said in the verdict, and the run passes
    (so that the next run finds it)."""
    perf_run(tmp_path, "failed", started="01", verdict="FAIL")
    first = perf_run(tmp_path, "first", started="02")
    gate = Gate.model_validate(GATE | {"baseline": "latest-pass"})
    report = RunReport.build(first, gates=[gate])
    row = report.verdicts.row(0, named=True) if report.verdicts is not None else {}
    assert row["verdict"] == "SKIP" and row["baseline_run"] is None
    assert row["reason"] == (
        f"no earlier run of m/cand in {tmp_path} passed its gates: "
        "nothing to compare with (a series' first run), skipped"
    )
    assert report.gates_passed is True
    several = verdict(first, baseline="latest-pass", runs=3)
    assert (several["verdict"], several["reason"]) == ("SKIP", row["reason"])
    assert report.verdict_line == (
        "PASS: 0 of 1 gate checks pass, none fails. 1 skipped: no earlier passing run to compare with."
    )


# Three healthy runs of a host whose whole runs differ by about +-6 % (its load that day), oldest
# first: their throughput over PACE's. The newest is the fastest, as latest-pass alone would pick.
SPREAD_RUNS = {"b1": 0.94, "b2": 1.00, "b3": 1.06}


def spread_root(root: Path) -> None:
    for i, (run, speed) in enumerate(SPREAD_RUNS.items()):
        perf_run(root, run, started=f"0{i + 1}", pace=PACE / speed, seed=10 + i, verdict="PASS")


def test_baseline_runs_hold_the_run_to_run_spread(tmp_path: Path) -> None:
    """A healthy run at the low end of the host's run-to-run spread: against the newest run alone
    (the request-only interval) it fails, against the three runs (runs and requests resampled) it
    passes; naming the three gives the same verdict as `runs: 3`."""
    spread_root(tmp_path)
    low_end = perf_run(tmp_path, "new", started="05", pace=PACE / 0.95, seed=20)
    single = verdict(low_end, baseline="latest-pass")
    assert (single["verdict"], single["baseline_run"]) == ("FAIL", "b3"), single
    assert single["ci_high"] < 0.97 and "(vs 1 baseline run: request noise only)" in single["reason"]
    repeats = verdict(low_end, baseline="latest-pass", runs=3)
    assert (repeats["verdict"], repeats["baseline_run"]) == ("PASS", "b1, b2, b3"), repeats
    assert repeats["ci_low"] < 0.95 < 0.97 <= repeats["ci_high"]
    assert repeats["baseline"] == pytest.approx(
        np.mean([verdict(low_end, baseline=r)["baseline"] for r in SPREAD_RUNS])
    )
    assert repeats["reason"].startswith(f"measured / mean(3 runs) = {0.95:.2f}")
    spread = re.search(r"\(vs 3 baseline runs, b1, b2, b3; run-to-run spread (\d+\.\d) %\)$", repeats["reason"])
    assert spread is not None and float(spread[1]) == round(100 * repeats["baseline_spread"], 1), repeats["reason"]
    assert 0.055 <= repeats["baseline_spread"] <= 0.065 and single["baseline_spread"] is None
    named = verdict(low_end, baseline=["b1", "b2", "b3"])
    judged = ("verdict", "ci_low", "ci_high", "reason")
    assert [named[k] for k in judged] == [repeats[k] for k in judged]
    assert named["gate"] == "perf_output_tok_s [decode @ 4] >= 0.97 x b1, b2, b3"
    assert repeats["gate"] == "perf_output_tok_s [decode @ 4] >= 0.97 x latest-pass (3 runs)"
    # Fewer passing runs than asked for: judged on those, and said.
    fewer = verdict(low_end, baseline="latest-pass", runs=5)
    assert fewer["baseline_run"] == "b1, b2, b3" and fewer["ci_low"] == repeats["ci_low"]
    assert fewer["reason"].endswith("; only 3 of the 5 earlier passing runs asked for (runs: 5): judged on those")


def test_a_15pc_drop_fails_against_baseline_runs(tmp_path: Path) -> None:
    """Baseline runs widen the interval by their spread, not without end: a run 15 % below their
    mean (10 % below the slowest) fails."""
    spread_root(tmp_path)
    slow = verdict(perf_run(tmp_path, "slow", started="05", pace=PACE / 0.85, seed=21), baseline="latest-pass", runs=3)
    assert slow["verdict"] == "FAIL" and slow["ci_high"] < 0.97, slow
    assert slow["value"] / slow["baseline"] == pytest.approx(0.85, abs=0.01)
    assert "no value in it is >= 0.97" in slow["reason"]


def test_the_two_level_interval_by_hand(tmp_path: Path) -> None:
    """Runs whose requests all take the same time: a request resample changes nothing, so against
    one run the interval is a point, and against two (100 % and 110 % of the measured run's
    throughput) it is what the runs alone give, which one can enumerate. Mean of two runs drawn
    with replacement: 100 (1/4), 105 (1/2), 110 (1/4); the run effect, one more run over their mean
    105: 100/105 or 110/105 (1/2 each). measured / (mean x effect) ranges from
    100 x 105 / (110 x 110) = 0.8678 (1/8) to 105 / 100 = 1.05 (1/8): 2.5 % quantiles inside both
    end classes, so those are the interval's ends."""
    perf_run(tmp_path, "same", started="01", spread=0, verdict="PASS")
    perf_run(tmp_path, "faster", started="02", pace=PACE / 1.1, spread=0, verdict="PASS")
    measured = perf_run(tmp_path, "measured", started="03", spread=0)
    alone = verdict(measured, baseline="same")
    assert (alone["ci_low"], alone["ci_high"]) == pytest.approx((1, 1), abs=1e-9)
    against_faster = verdict(measured, baseline="faster")
    assert (against_faster["ci_low"], against_faster["ci_high"]) == pytest.approx((1 / 1.1, 1 / 1.1), abs=1e-9)
    both = verdict(measured, baseline="latest-pass", runs=2)
    assert (both["ci_low"], both["ci_high"]) == pytest.approx((100 * 105 / (110 * 110), 105 / 100), abs=1e-6)
    assert both["baseline"] == pytest.approx(1.05 * alone["baseline"])
    # The same two runs with request noise: each level widens the interval further.
    for i, (run, pace) in enumerate((("n-same", PACE), ("n-faster", PACE / 1.1), ("n-measured", PACE))):
        perf_run(tmp_path / "noisy", run, started=f"0{i + 1}", pace=pace, seed=i)
    noisy_alone = verdict(tmp_path / "noisy" / "n-measured", baseline="n-same")
    noisy_both = verdict(tmp_path / "noisy" / "n-measured", baseline=["n-same", "n-faster"])
    widths = [r["ci_high"] - r["ci_low"] for r in (alone, noisy_alone, both, noisy_both)]
    assert widths[0] < widths[1] < widths[2] < widths[3], widths


def test_baseline_runs_rarely_fail_a_healthy_run() -> None:
    """On figures alone: a host whose whole runs differ by 6 % (0.4 % request noise within a run),
    a healthy run judged at ratio 0.97. Against one run a third fail; against five, the measured
    run's own run-to-run effect drawn from the baselines' spread keeps it to about 1 in 20 (the
    mean of the runs alone, narrowing as 1/sqrt(5), fails about 1 in 10); a 20 % drop still fails
    most often."""
    rng = np.random.default_rng(7)

    def fails(k: int, drop: float) -> bool:
        observed = 1 + 0.06 * rng.standard_normal(k)
        baselines = [o * (1 + 0.004 * rng.standard_normal(2000)) for o in observed]
        measured = drop * (1 + 0.06 * rng.standard_normal()) * (1 + 0.004 * rng.standard_normal(2000))
        ratios = perf_resample.runs_ratios(measured, baselines, list(observed), seed=int(rng.integers(2**31)))
        return perf_resample.bounds(ratios)[1] < 0.97

    rate = {(k, drop): np.mean([fails(k, drop) for _ in range(400)]) for k in (1, 5) for drop in (1.0, 0.8)}
    assert rate[(1, 1.0)] > 0.2 and rate[(5, 1.0)] < 0.07, rate
    assert rate[(5, 0.8)] > 0.8, rate


def test_fleet_run_refuses_a_baseline_run_missing_from_the_root(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from test_inputs import tiny

    perf_run(tmp_path / "root", "base", started="01")
    manifest = tmp_path / "m.yaml"
    gate = json.dumps(GATE | {"baseline": ["base", "nope"]})
    perf_block = "perf:\n  - {name: decode, concurrency: [4], input_tokens: 8, output_tokens: 4, num_requests: 4}\n"
    manifest.write_text(tiny() + perf_block + f"gates:\n  - {gate}\n")
    code = cli.main(["run", "--check", str(manifest), "--results", str(tmp_path / "root")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"error: gates: baseline run 'nope' is not in {tmp_path / 'root'} (1 runs there: base)" in err


def test_gate_fields_say_how_to_write_a_baseline() -> None:
    perf_gate = {"metric": "perf_output_tok_s", "scenario": "decode", "level": 8, "op": ">="}
    Gate.model_validate(perf_gate | {"baseline": "latest-pass", "ratio": 0.97})  # the example
    cases = [
        (perf_gate | {"baseline": 570.4, "threshold": 0.97}, "write ratio: 0.97"),
        (perf_gate | {"ratio": 0.97}, "ratio multiplies a baseline"),
        (perf_gate | {"baseline": "latest-pass"}, "a baseline needs ratio"),
        (perf_gate, "set threshold"),
        ({"metric": "pearson_r", "op": ">=", "baseline": "latest-pass", "ratio": 1}, "for pearson_r give a stored"),
        (perf_gate | {"baseline": "../run", "ratio": 0.97}, "is not a name"),
        (perf_gate | {"baseline": "base", "runs": 3, "ratio": 0.97}, "runs counts latest-pass's runs"),
        (perf_gate | {"baseline": "latest-pass", "runs": 0, "ratio": 0.97}, "greater than or equal to 1"),
        (perf_gate | {"baseline": ["a", "latest-pass"], "ratio": 0.97}, "latest-pass stands alone"),
        (perf_gate | {"baseline": ["a", "b", "a"], "ratio": 0.97}, "baseline runs repeat a run id: a, b, a"),
        (perf_gate | {"baseline": [], "ratio": 0.97}, "names at least one run id"),
        (perf_gate | {"baseline": ["a", "../run"], "ratio": 0.97}, "is not a name"),
    ]
    for spec, message in cases:
        with pytest.raises(ValidationError, match=message.replace(".", r"\.")):
            Gate.model_validate(spec)


def test_gates_recorded_before_ratio_still_read(tmp_path: Path) -> None:
    """run.json of a run made when a stored baseline's factor was `threshold`: read as `ratio`."""
    old = {"metric": "output_tok_s", "op": ">=", "threshold": 0.5, "baseline": {"cand": 1.0}}
    run = write_run(tmp_path / "old", {"cand": SAME}, gate_specs=[old])
    [gate] = gates.from_info(reader.read_info(run))
    assert (gate.ratio, gate.threshold, gate.baseline) == (0.5, None, {"cand": 1.0})


def test_resampled_figures_are_the_reports_on_every_request() -> None:
    """Drawing each request once gives perf.summary's figure exactly, for every figure a run
    baseline can gate (failed and one-token requests included)."""
    requests, levels = mixed_level()
    [expected] = perf.summary(requests, levels).to_dicts()
    level = perf_resample.Level.of(requests, 2.0)
    once = np.ones((1, level.n_requests), dtype=np.int64)
    for metric in sorted(RESAMPLED):
        column = metric.removeprefix("perf_")
        assert level.figure(column, once)[0] == pytest.approx(expected[column], rel=1e-12), column


def test_compare_gives_perf_deltas_an_interval(tmp_path: Path) -> None:
    base = perf_run(tmp_path, "base", started="01")
    slow = perf_run(tmp_path, "slow", started="02", seed=1, pace=PACE / DROP)
    frame = compare.compare(base, slow)
    row = frame.filter(pl.col("metric") == "perf_output_tok_s@decode@4").row(0, named=True)
    assert row["delta_ci_low"] < row["delta"] < row["delta_ci_high"] < 0  # slower, beyond noise
    no_interval = frame.filter(pl.col("metric") == "n_prompts").row(0, named=True)  # fixed by the run's design
    assert no_interval["delta_ci_low"] is None
    text = compare.render(frame, run_a=base, run_b=slow)
    assert "delta 95 % CI" in text
    line = next(x for x in text.splitlines() if "perf_output_tok_s@decode@4" in x)
    assert f"[{row['delta_ci_low']:.4g}, {row['delta_ci_high']:.4g}]" in line


def test_trend_across_a_root(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = tmp_path / "root"
    for i, (run, pace) in enumerate([("r1", PACE), ("r2", PACE), ("r3", PACE / DROP)]):
        perf_run(root, run, started=f"0{i}", pace=pace, seed=i)
    perf_run(root, "r4", started="05", level=8)  # another level: its own series
    out = tmp_path / "trend.html"
    assert cli.main(["runs", str(root), "--trend", "perf_output_tok_s", "--html", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"perf_output_tok_s across 4 runs of {root}" in text
    assert "m / cand decode@4  ██▁·" in text and "m / cand decode@8  ···▄" in text
    assert "(-5." in text  # the last of decode@4 against the run before
    page = out.read_text()
    assert page.count("<polyline") == 2 and "r3" in page and "Content-Security-Policy" in page
    assert cli.main(["runs", str(root), "--trend", "pearson_r"]) == 2
    assert "one run's parity analysis" in capsys.readouterr().err


DOUBLE = """
models:
  - {name: m, source: {kind: synthetic, seed: 3}}
prompts:
  p: [{id: a, prompt: "one"}]
targets:
  - {name: ref, kind: test-double, num_cpus: 0.5}
  - {name: cand, kind: test-double, num_cpus: 0.5, seconds_per_token: PACE}
reference: ref
sampling: {max_tokens: 2, logprobs: 2}
perf:
  - {name: decode, concurrency: [4], input_tokens: 8, output_tokens: 16, num_requests: 32, warmup_requests: 4,
     targets: [cand]}
"""


@pytest.mark.alone
def test_double_through_ray_a_5pc_slower_stream_fails(local_ray: object, tmp_path: Path) -> None:
    """The whole path: perf levels through Ray and the load generator (the test double streams at a
    set pace, on deadlines), stored, found in the root's catalog and judged. A test double never
    passes a gate, so the judgement against the baseline is read where the verdict keeps it."""
    from fleet.run import driver

    root = tmp_path / "results"
    for run, pace in (("base", 0.01), ("healthy", 0.01), ("slow", 0.01 / DROP)):
        manifest = tmp_path / f"{run}.yaml"
        manifest.write_text(DOUBLE.replace("PACE", repr(pace)))
        _, outcome = driver.run(manifest, results_dir=root, run_id=run, progress=False)
        assert not outcome.failures, outcome.failures
    gate = Gate.model_validate(GATE | {"baseline": "base"})
    judged, row_reasons = {}, {}
    for run in ("healthy", "slow"):
        report = RunReport.build(root / run, gates=[gate])
        runs = RunBaselines(report.run_dir, report.info, report.tables["perf_requests"], report.tables["perf_levels"])
        measured = report.scenarios["output_tok_s"][0] if report.scenarios is not None else None
        judged[run] = runs.judge(gate, "m", "cand", measured)
        row = report.verdicts.row(0, named=True) if report.verdicts is not None else {}
        row_reasons[run] = row["reason"]
        assert row["verdict"] == "FAIL" and judged[run]["reason"] in row["reason"]
    assert (
        "test double (no model ran): never a PASS (against its baseline: PASS, measured / base"
        in row_reasons["healthy"]
    )
    # A repeat at the same pace lands within a few per cent of its baseline; the request bootstrap
    # does not see a whole run being a little slower (docs/metrics.md), so 1 need not be inside it.
    assert (
        judged["healthy"]["verdict"] == "PASS"
        and 0.97 < judged["healthy"]["ci_low"] <= judged["healthy"]["ci_high"] < 1.03
    )
    assert judged["slow"]["verdict"] == "FAIL" and judged["slow"]["ci_high"] < 0.97
    # Against both earlier runs (runs and requests resampled): a paced stream's runs differ little,
    # so the interval stays narrow and the 5 % slower stream still fails.
    both = runs.judge(Gate.model_validate(GATE | {"baseline": ["base", "healthy"]}), "m", "cand", measured)
    assert both["verdict"] == "FAIL" and both["ci_high"] < 0.97, both
    assert "(vs 2 baseline runs, base, healthy; run-to-run spread " in both["reason"]
