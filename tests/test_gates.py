"""fleet.gates against hand-made metric frames: every verdict below is worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from pydantic import ValidationError
from test_compare import SAME, write_run

from fleet.analysis import gates, throughput
from fleet.analysis import parity as analysis
from fleet.contracts.errors import UserError
from fleet.results import reader

RUN = Path("/runs/r1")
# Two candidates of model m against reference `ref`; model m2 has one candidate.
PARITY = pl.DataFrame(
    {
        "model": ["m", "m", "m2"],
        "target": ["bf16", "fp16", "bf16"],
        "first_top1_agreement": [1.0, 5 / 6, 1.0],
        "pearson_r": [0.995, None, math.nan],  # fp16: fewer than two matched tokens; m2: NaN
        "first_prob_rel_err_mean": [0.0099, 0.0101, 0.01],
    }
)
THROUGHPUT = pl.DataFrame(
    {
        "model": ["m", "m", "m", "m2", "m2"],
        "target": ["ref", "bf16", "fp16", "ref", "bf16"],
        "output_tok_s": [100.0, 960.0, 940.0, 50.0, 10.0],
    }
)


def _evaluate(specs: list[dict[str, Any]], **kwargs: Any) -> pl.DataFrame:
    return gates.evaluate(gates.parse(specs), PARITY, THROUGHPUT, run_dir=RUN, reference="ref", **kwargs)


def _verdicts(frame: pl.DataFrame) -> dict[tuple[str, str], str]:
    return {(r["model"], r["target"]): r["verdict"] for r in frame.iter_rows(named=True)}


def test_threshold_boundaries() -> None:
    # >= 1.0: exactly 1.0 passes, 5/6 fails; m2's candidate is checked too (all models by default).
    v = _evaluate([{"metric": "first_top1_agreement", "op": ">=", "threshold": 1.0}])
    assert _verdicts(v) == {("m", "bf16"): "PASS", ("m", "fp16"): "FAIL", ("m2", "bf16"): "PASS"}
    # <= 0.01: 0.0099 and 0.01 pass, 0.0101 fails; < 0.01: 0.01 itself fails.
    v = _evaluate([{"metric": "first_prob_rel_err_mean", "op": "<=", "threshold": 0.01}])
    assert _verdicts(v) == {("m", "bf16"): "PASS", ("m", "fp16"): "FAIL", ("m2", "bf16"): "PASS"}
    v = _evaluate([{"metric": "first_prob_rel_err_mean", "op": "<", "threshold": 0.01}])
    assert _verdicts(v)[("m2", "bf16")] == "FAIL"
    row = v.filter(pl.col("target") == "bf16", pl.col("model") == "m").row(0, named=True)
    assert (row["value"], row["op"], row["threshold"], row["metric"]) == (0.0099, "<", 0.01, "first_prob_rel_err_mean")
    assert row["reason"] == "0.0099 < 0.01 is true"


def test_unmeasured_values_fail_with_a_reason() -> None:
    v = _evaluate([{"metric": "pearson_r", "op": ">=", "threshold": 0.99}])
    assert _verdicts(v) == {("m", "bf16"): "PASS", ("m", "fp16"): "FAIL", ("m2", "bf16"): "FAIL"}
    for row in v.filter(pl.col("verdict") == "FAIL").iter_rows(named=True):
        assert row["value"] is None and "not measured" in row["reason"]


def test_missing_targets_fail() -> None:
    # A named target without results, and one the manifest expected (it failed outright).
    v = _evaluate([{"metric": "first_top1_agreement", "op": ">=", "threshold": 1, "models": ["m"], "targets": ["npu"]}])
    assert v.select("target", "verdict").rows() == [("npu", "FAIL")]
    assert "no results" in v["reason"][0]
    v = _evaluate(
        [{"metric": "first_top1_agreement", "op": ">=", "threshold": 1}], expected=[("m", "ref"), ("m", "int8")]
    )
    assert _verdicts(v)[("m", "int8")] == "FAIL" and ("m", "ref") not in _verdicts(v)
    # Nothing ran at all, and a named model with no candidates: neither passes by having nothing to check.
    empty = gates.evaluate(gates.parse([{"metric": "mae", "op": "<", "threshold": 1}]), pl.DataFrame(), pl.DataFrame(),
                           run_dir=RUN, reference="ref")  # fmt: skip
    assert empty.select("model", "target", "verdict").rows() == [("*", "*", "FAIL")]
    v = _evaluate([{"metric": "pearson_r", "op": ">=", "threshold": 0.9, "models": ["m3"]}])
    assert v.select("model", "target", "verdict").rows() == [("m3", "*", "FAIL")]


def test_throughput_against_a_baseline() -> None:
    # 0.95 x 1000 = 950: 960 passes, 940 fails. m2/bf16 has no baseline entry: FAIL, not PASS.
    spec = {"metric": "output_tok_s", "op": ">=", "ratio": 0.95, "baseline": {"m/bf16": 1000.0, "fp16": 1000.0}}
    v = _evaluate([spec])
    assert _verdicts(v) == {("m", "bf16"): "PASS", ("m", "fp16"): "FAIL", ("m2", "bf16"): "FAIL"}
    rows = {(r["model"], r["target"]): r for r in v.iter_rows(named=True)}
    assert (rows[("m", "bf16")]["threshold"], rows[("m", "bf16")]["baseline"]) == (pytest.approx(950.0), 1000.0)
    assert rows[("m2", "bf16")]["reason"] == "no baseline for m2/bf16"
    # A scalar baseline, and the reference is checked only when named: 100 >= 0.5 x 180 = 90.
    v = _evaluate([{"metric": "output_tok_s", "op": ">=", "ratio": 0.5, "baseline": 180, "targets": ["ref"]}])
    assert _verdicts(v) == {("m", "ref"): "PASS", ("m2", "ref"): "FAIL"}  # m2: 50 < 90
    assert v["gate"][0] == "output_tok_s >= 0.5 x baseline"


def test_probe_metrics_from_extra_frames() -> None:
    layers = pl.DataFrame({"model": ["m"], "target": ["bf16"], "layer_cosine_min": [0.9995]})
    v = _evaluate([{"metric": "layer_cosine_min", "op": ">", "threshold": 0.99, "models": ["m"]}], extra=[layers])
    assert _verdicts(v) == {("m", "bf16"): "PASS", ("m", "fp16"): "FAIL"}  # fp16 has no layer result


def test_validation_errors() -> None:
    with pytest.raises(ValidationError, match="unknown metric 'pearson'; did you mean 'pearson_r'"):
        gates.Gate(metric="pearson", op=">=", threshold=0.99)
    with pytest.raises(ValidationError):
        gates.Gate.model_validate({"metric": "pearson_r", "op": "=>", "threshold": 0.99})
    with pytest.raises(ValidationError):
        gates.Gate.model_validate({"metric": "pearson_r", "op": ">=", "threshold": math.inf})
    with pytest.raises(UserError, match=r"gates\[1\]\.treshold: unknown key 'treshold'"):
        gates.parse([{"metric": "mae", "op": "<", "threshold": 1}, {"metric": "mae", "op": "<", "treshold": 1}])
    with pytest.raises(UserError, match="expected a list of gates"):
        gates.parse({"metric": "mae"})


def test_metrics_cover_analysis_columns() -> None:
    """Every parity and throughput column is gateable (the list is kept in sync with fleet.analysis)."""
    empty = reader.load(Path("/nonexistent"))
    columns = analysis.parity(empty["requests"], empty["tokens"], "ref").columns
    columns += throughput.throughput(empty["requests"], empty["shards"]).columns
    assert set(columns) - {"model", "target"} <= set(gates.METRICS)


def test_evidence_selects_the_rows_behind_the_metric(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {"cand": SAME})
    specs = [{"metric": m, "op": ">=", "threshold": 0} for m in ("first_top1_agreement", "tf_max_abs_logprob_diff")]
    specs.append({"metric": "output_tok_s", "op": ">=", "threshold": 0})
    v = gates.evaluate(gates.parse(specs), pl.DataFrame(), pl.DataFrame(), run_dir=run, reference="ref",
                       expected=[("m", "cand")])  # fmt: skip
    counts = {}
    for row in v.iter_rows(named=True):
        rows = eval(row["evidence"], {"pl": pl}).collect()  # the evidence is a Polars expression, run as is
        counts[row["metric"]] = (rows.height, sorted(set(rows["target"])))
    # position 0 of p1 and p2, candidate and reference; all 6 candidate tokens; the candidate's one shard.
    assert counts == {
        "first_top1_agreement": (4, ["cand", "ref"]),
        "tf_max_abs_logprob_diff": (6, ["cand"]),
        "output_tok_s": (1, ["cand"]),
    }


def test_passed_and_load(tmp_path: Path) -> None:
    v = _evaluate([{"metric": "first_top1_agreement", "op": ">=", "threshold": 1.0, "name": "top-1 agreement"}])
    assert not gates.passed(v) and gates.passed(v.filter(pl.col("verdict") == "PASS"))
    assert gates.passed(v.clear())  # no gates: nothing fails
    assert v.filter(pl.col("verdict") == "FAIL")["gate"].to_list() == ["top-1 agreement"]
    path = tmp_path / "gates.yaml"
    path.write_text('gates:\n  - {metric: pearson_r, op: ">=", threshold: 0.99, targets: [vllm-npu-bf16]}\n')
    assert gates.load(path) == [gates.Gate(metric="pearson_r", op=">=", threshold=0.99, targets=["vllm-npu-bf16"])]
