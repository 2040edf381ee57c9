"""Issue 19 item 5, "no vacuous PASS": each hole where a gate could pass on nothing, closed. Each
hole has a test here that failed on the code before the fix (checked with the fix stashed).

* a. a NaN in any summary's rows makes the figure missing (null), which a gate fails as "not measured";
* b. top-1 and top-k matching are tie-aware, so a tie is a hit whatever the token ids;
* c. an incomplete (model, target) fails its gates, and exit 4 takes precedence over 3;
* d. 003's stage table says "passed" only for a stage whose gates passed (`after:` itself: test_scheduler);
* f. `fleet query`'s views use the manifest's near_tie_nats.
(e, 004's gates: test_seed_manifests.)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from test_analysis import REF, _frame, _req, _tok
from test_compare import DIVERGED, SAME, write_run
from test_perf import _request

from fleet import cli
from fleet.analysis import gates, probe_metrics, probes, query, ties
from fleet.analysis import parity as analysis
from fleet.analysis import perf as fleet_perf
from fleet.contracts import perf_schema, schema
from fleet.report.model import RunReport
from fleet.results.store import RunStore

NAN = math.nan

# --- a. NaN counts as missing in every summary ---------------------------------------------------


def test_a_nan_probe_row_makes_the_probe_summaries_missing() -> None:
    """Polars' min skips NaN: logits_cosine_min was the minimum of the other rows (0.999, a PASS)."""
    keys = {"model": "m", "target": "c", "prompt_set": "s", "prompt_id": ["p1", "p2"], "position": [0, 0]}
    errors = pl.DataFrame(
        keys
        | {"same_input": [True, True], "cosine": [0.999, NAN], "nmse": [0.001, 0.001], "max_abs_err": [0.1, NAN]}
        | {"kl": [0.01, 0.01], "top1_match": [True, True], "top5_match": [True, True]}
    )
    [row] = probes.logits_summary(errors).to_dicts()
    assert row["logits_cosine_min"] is None and row["logits_max_abs_err"] is None
    assert row["logits_kl_max"] == pytest.approx(0.01)  # a column without NaN keeps its figure
    verdicts = gates.evaluate(
        gates.parse([{"metric": "logits_cosine_min", "op": ">=", "threshold": 0.99}]),
        pl.DataFrame({"model": ["m"], "target": ["c"]}),
        pl.DataFrame({"model": ["m"], "target": ["c"]}),
        run_dir="/r",
        reference="ref",
        extra=[probes.logits_summary(errors)],
    )
    assert verdicts["verdict"].to_list() == ["FAIL"] and "not measured" in verdicts["reason"][0]


def test_a_nan_layer_makes_the_layer_summary_missing() -> None:
    curve = pl.DataFrame(
        {"model": "m", "target": "c", "layer": [0, 1], "cosine": [0.9999, NAN], "rel_l2": [0.01, 0.02]}
        | {"within_0p1pct": [1.0, 1.0], "within_0p5pct": [1.0, 1.0]}
    )
    [row] = probes.layer_summary(curve).to_dicts()
    assert row["layer_cosine_min"] is None and row["layer_rel_l2_max"] == pytest.approx(0.02)


def test_a_nan_logprob_makes_the_teacher_forced_figures_missing() -> None:
    """tf_max_abs_logprob_diff was max(|dlogp|) over the other positions: 0.25 <= 0.5, a PASS."""
    requests = _frame(schema.REQUESTS, [_req(REF, "p", [5, 6]), _req("c", "p", [5, 6])])
    tokens = _frame(
        schema.TOKENS,
        [
            _tok(REF, "p", 0, 5, -0.5),
            _tok(REF, "p", 1, 6, -1.0),
            _tok("c", "p", 0, 5, -0.75, ref=(-0.5, [5], [-0.5])),
            _tok("c", "p", 1, 6, NAN, ref=(-1.0, [6], [-1.0])),
        ],
    )
    [row] = analysis.parity(requests, tokens, REF).to_dicts()
    assert row["tf_max_abs_logprob_diff"] is None
    assert row["tf_mean_abs_logprob_diff"] is None and row["mae"] is None


def test_a_nan_latency_makes_the_perf_figures_missing() -> None:
    requests = pl.DataFrame(
        [_request(0, 0.2, [0.1], 0.3), _request(1, NAN, [0.1], 0.3, delay=NAN)],
        schema=pl.from_arrow(perf_schema.PERF_REQUESTS.empty_table()).schema,  # type: ignore[union-attr]
    )
    levels = pl.DataFrame(
        [{"model": "m", "model_weights": "w", "target": "t", "scenario": "s", "level": 2, "wall_s": 1.0}]
    ).with_columns(request_rate=pl.lit(None, pl.Float64))
    [row] = fleet_perf.summary(requests, levels).to_dicts()
    assert row["ttft_p99_s"] is None and row["ttft_mean_s"] is None and row["queue_delay_max_s"] is None
    assert row["e2e_p50_s"] == pytest.approx(0.3)


def test_a_nan_logprob_leaves_the_error_spread_unmeasured() -> None:
    lp = np.log(np.full((1, 4), 0.25, dtype=np.float32))
    bad = lp.copy()
    bad[0, 2] = np.nan
    frame = _logits({"ref": lp, "c": bad})
    [row] = probes.logits_distribution(frame, "ref").to_dicts()
    assert row["abs_err_max"] is None and row["within_bound"] is None


def _logits(per_target: dict[str, np.ndarray]) -> pl.DataFrame:
    from test_probes import logits_frame

    return logits_frame({t: [("p", [1, 2], lp)] for t, lp in per_target.items()})


# --- b. tie-aware top-k matching -----------------------------------------------------------------


def test_b_probe_top1_counts_a_tie_as_a_match() -> None:
    ref = np.array([0.0, 1.0, 0.5, -1.0, -2.0, -3.0])
    cand = np.array([1.0, 1.0, 0.5, -1.0, -2.0, -3.0])  # ids 0 and 1 tie; argmax says 0
    m = probe_metrics.logits_metrics(ref, cand)
    assert m["top1_match"] is True
    # A real miss stays a miss: the reference's top-1 is below the candidate's maximum.
    assert probe_metrics.logits_metrics(ref, np.array([1.0, 0.9, 0.5, -1.0, -2.0, -3.0]))["top1_match"] is False


def test_b_probe_top5_compares_against_the_kth_value() -> None:
    ref = np.array([6.0, 5.0, 4.0, 3.0, 1.0, 2.0, 0.0])  # top-5: ids 0, 1, 2, 3, 5
    cand = np.array([6.0, 5.0, 4.0, 3.0, 2.0, 2.0, 0.0])  # ids 4 and 5 tie for the 5th place
    m = probe_metrics.logits_metrics(ref, cand)
    assert m["top5_match"] is True and m["top5_overlap"] == 1.0
    swapped = np.array([6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0])  # id 4 is 5th outright: a real miss
    m = probe_metrics.logits_metrics(ref, swapped)
    assert m["top5_match"] is False and m["top5_overlap"] == pytest.approx(0.8)


def test_b_top_k_rule_by_hand() -> None:
    assert ties.topk_match(np.array([3.0, 2.0, 2.0, 2.0]), np.array([3.0, 2.0, 1.0, 0.0]), 2)
    # The reference's ids 1-3 tie for 2nd: any of them completes its top-3, id 3 the candidate's.
    assert ties.topk_match(np.array([3.0, 2.0, 2.0, 2.0]), np.array([3.0, 0.0, 1.0, 2.0]), 3)
    # Forced tokens on both sides that do not fit in k slots together: no common top-2.
    assert not ties.topk_match(np.array([3.0, 2.0, 0.0]), np.array([3.0, 0.0, 2.0]), 2)


def test_b_teacher_forced_and_first_step_top1_are_tie_aware() -> None:
    """The candidate's token 3 ties the reference's top-1 7 (both -0.5 at the same prefix)."""
    requests = _frame(schema.REQUESTS, [_req(REF, "p", [7, 6]), _req("c", "p", [3, 6])])
    tokens = _frame(
        schema.TOKENS,
        [
            _tok(REF, "p", 0, 7, -0.5),
            _tok(REF, "p", 1, 6, -1.0),
            _tok("c", "p", 0, 3, -0.5, ref=(-0.5, [7, 3], [-0.5, -0.5])),
            _tok("c", "p", 1, 6, -1.0, topk=([6, 2], [-1.0, -1.0]), ref=(-1.5, [2, 6], [-0.5, -1.5])),
        ],
    )
    [row] = analysis.parity(requests, tokens, REF).to_dicts()
    # Position 0 ties; position 1: the candidate's 6 and 2 tie, and 2 is the reference's top-1.
    assert row["tf_top1_agreement"] == 1.0
    assert row["first_top1_agreement"] == 1.0
    assert analysis.first_step(tokens, REF)["top1_match"].to_list() == [True]


# --- c. an incomplete pair fails its gates; exit 4 before 3 ---------------------------------------

FIRST_TOP1 = [{"metric": "first_top1_agreement", "op": ">=", "threshold": 1.0}]


def test_c_failed_shards_fail_the_gates_and_exit_4_on_a_partial_run(tmp_path: Path) -> None:
    """cand lost its shard with p2: on p1 alone it agrees, so the gate passed and the exit was 3."""
    run = write_run(tmp_path / "r", {"cand": {"p1": SAME["p1"]}}, gate_specs=FIRST_TOP1)
    RunStore(run).update_info(status="partial", failed_shards={"m/cand/s/00001": "engine died"})
    report = RunReport.build(run)
    [row] = report.verdicts.to_dicts()  # type: ignore[union-attr]
    assert row["verdict"] == "FAIL" and "failed shard m/cand/s/00001" in row["reason"]
    assert "1 of the reference's 2 prompts missing" in row["reason"]
    assert cli.main(["report", str(run)]) == cli.EXIT_GATES


def test_c_missing_rows_fail_the_gates_even_when_nothing_is_recorded_as_failed(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", {"cand": {"p1": SAME["p1"]}}, gate_specs=FIRST_TOP1)
    assert RunReport.build(run).gates_passed is False
    assert cli.main(["report", str(run)]) == cli.EXIT_GATES


def test_c_a_failed_reference_leaves_its_candidates_incomplete(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", {"cand": SAME}, gate_specs=FIRST_TOP1)
    RunStore(run).update_info(status="partial", failed_shards={"m/ref/s/00001": "out of memory"})
    assert RunReport.build(run).gates_passed is False


def test_c_partial_without_a_failed_gate_is_still_3(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", {"cand": SAME, "other": SAME}, gate_specs=[FIRST_TOP1[0] | {"targets": ["cand"]}])
    RunStore(run).update_info(status="partial", failed_shards={"m/other/s/00000": "engine died"})
    assert RunReport.build(run).gates_passed is True
    assert cli.main(["report", str(run)]) == cli.EXIT_PARTIAL


def test_c_exit_4_takes_precedence_over_3(tmp_path: Path) -> None:
    """A gate fails on cand's own figures while `other` lost a shard: exit 4 (it was 3)."""
    gate = {"metric": "seq_match_rate", "op": ">=", "threshold": 1.0, "targets": ["cand"]}
    run = write_run(tmp_path / "r", {"cand": DIVERGED, "other": SAME}, gate_specs=[gate])
    RunStore(run).update_info(status="partial", failed_shards={"m/other/s/00009": "engine died"})
    assert cli.main(["report", str(run)]) == cli.EXIT_GATES


# --- f. `fleet query` views use the manifest's parity settings ------------------------------------


def test_f_query_views_use_the_manifests_near_tie_nats(tmp_path: Path) -> None:
    """test_divergence's run: its 0.01-nat flip is a near tie against the noise model's default
    (0.13 nats), a divergence against the manifest's 0.005: the query must say what the report says."""
    from test_compare import _table
    from test_divergence import _run

    requests, tokens = _run()
    info = {"run_id": "r", "reference": REF, "manifest_resolved": {"parity": {"near_tie_nats": 0.005}}}
    store = RunStore.create(tmp_path / "r", info)
    weights = pl.lit("w").alias("model_weights")
    for target in (REF, "vllm"):
        shard = f"m/{target}/s/00000"
        mine = pl.col("target") == target
        reqs = requests.filter(mine).with_columns(weights, shard_id=pl.lit(shard)).to_dicts()
        store.write("requests", shard, _table(schema.REQUESTS, reqs))
        store.write("tokens", shard, _table(schema.TOKENS, tokens.filter(mine).with_columns(weights).to_dicts()))
    kinds = dict(query.query(tmp_path / "r", "SELECT prompt_id, kind FROM divergences").rows())
    assert kinds["tie"] == "divergence"
    assert query.query(tmp_path / "r", "SELECT real_divergences FROM parity").item() == 3


# --- d. 003's seed report says "passed" only for a stage whose gates passed ------------------------


def test_d_seed_stages_say_passed_only_when_the_gates_passed(tmp_path: Path) -> None:
    from fleet.report.blocks import SECTIONS
    from fleet.report.layouts import seed_sections  # noqa: F401  (registers the seed sections)

    gate = {"metric": "seq_match_rate", "op": ">=", "threshold": 1.0}
    run = write_run(tmp_path / "r", {"cand": DIVERGED, "good": SAME}, gate_specs=[gate])
    [block] = SECTIONS["stages"].section(RunReport.build(run)).blocks
    results = dict(zip(block.frame["target"], block.frame["result"], strict=True))  # type: ignore[attr-defined]
    assert results == {"cand": "gates failed: seq_match_rate >= 1", "good": "passed"}
