"""fleet.compare on two small hand-made run directories (written through fleet.store.RunStore).

`write_run` is also used by test_query and test_html: one model `m`, prompt set `s`, prompts p1
and p2 of three tokens each, a reference `ref` and candidates whose outputs the test chooses.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from mdcheck import rows

from fleet.analysis import gates, parity_resample
from fleet.contracts import schema
from fleet.report import compare
from fleet.results import reader
from fleet.results.store import RunStore

# Reference outputs: prompt -> [(token, logprob)]. Logprobs are multiples of 1/4, exact in float32.
REF_OUT = {"p1": [(5, -0.5), (6, -1.0), (7, -0.25)], "p2": [(5, -0.25), (8, -0.5), (9, -1.0)]}
# A candidate equal to the reference, and one diverging on p2 at position 1 (3 instead of 8).
# Entries are (token, candidate logprob, reference's teacher-forced logprob of that token).
SAME = {
    "p1": [(5, -0.75, -0.5), (6, -1.0, -1.0), (7, -0.25, -0.25)],
    "p2": [(5, -0.25, -0.25), (8, -0.5, -0.5), (9, -1.0, -1.0)],
}
DIVERGED = {"p1": SAME["p1"], "p2": [(5, -0.25, -0.25), (3, -0.75, -1.5), (9, -1.0, -1.25)]}
PROMPTS = {"p1": "The capital of France is", "p2": "Two plus two equals"}


def _table(arrow_schema: pa.Schema, rows: list[dict[str, Any]]) -> pa.Table:
    """Rows with exactly the schema's columns (absent ones null; keys the schema lacks dropped)."""
    names = arrow_schema.names
    return pa.Table.from_pylist([{c: row.get(c) for c in names} for row in rows], schema=arrow_schema)


def _keys(target: str) -> dict[str, Any]:
    # model_weights: a key column other sessions may add to the schema; dropped when absent.
    return {"model": "m", "target": target, "prompt_set": "s", "model_weights": "0123456789abcdef"}


def _write_target(
    store: RunStore,
    target: str,
    outputs: dict[str, list[tuple[Any, ...]]],
    *,
    wall_s: float,
    expected: dict[str, str] | None = None,
) -> None:
    shard = f"m/{target}/s/00000"
    requests, tokens = [], []
    for i, (pid, out) in enumerate(sorted(outputs.items())):
        ids = [t[0] for t in out]
        requests.append(_keys(target) | {
            "prompt_id": pid, "shard_id": shard, "prompt": PROMPTS.get(pid, f"Prompt {pid}"),
            "prompt_token_ids": [1, 2],
            "output_text": " ".join(f"t{t}" for t in ids), "output_token_ids": ids, "n_prompt_tokens": 2,
            "n_output_tokens": len(ids), "finish_reason": "length", "queue_s": 0.0,
            "ttft_s": 0.01 * (i + 1), "tpot_s": 0.005, "e2e_s": 0.1 * (i + 1), "expected": (expected or {}).get(pid),
        })  # fmt: skip
        for pos, (tok, lp, *ref) in enumerate(out):
            row = _keys(target) | {"prompt_id": pid, "position": pos, "token_id": tok, "logprob": lp, "rank": 1}
            row |= {"topk_ids": [tok], "topk_logprobs": [lp]}
            if ref:  # a candidate row: the reference's teacher-forced view of the same token
                row |= {"ref_logprob": ref[0], "ref_rank": 1, "ref_topk_ids": [tok], "ref_topk_logprobs": [ref[0]]}
            tokens.append(row)
    n_tokens = sum(len(o) for o in outputs.values())
    shard_row = _keys(target) | {"shard_id": shard, "n_requests": len(outputs), "n_output_tokens": n_tokens}
    shard_row |= {"wall_s": wall_s, "hostname": "node-1"}
    store.write("requests", shard, _table(schema.REQUESTS, requests))
    store.write("tokens", shard, _table(schema.TOKENS, tokens))
    store.write("shards", shard, _table(schema.SHARDS, [shard_row]))


def write_model_dir(path: Path) -> Path:
    """A model directory with a config.json and a safetensors file of 40 parameters (4x8 + 8)."""
    path.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "num_hidden_layers": 2, "vocab_size": 512, "rope_parameters": {"rope_theta": 10000.0}}  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    header = json.dumps({"w": {"dtype": "F32", "shape": [4, 8], "data_offsets": [0, 128]},
                         "b": {"dtype": "F32", "shape": [8], "data_offsets": [128, 160]}}).encode()  # fmt: skip
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(160))
    return path


def write_run(
    run_dir: Path,
    candidates: dict[str, dict[str, list[tuple[Any, ...]]]],
    *,
    wall_s: dict[str, float] | None = None,
    versions: dict[str, str] | None = None,
    gate_specs: list[dict[str, Any]] | None = None,
    model_dir: Path | None = None,
    failures: dict[str, str] | None = None,
    expected: dict[str, str] | None = None,
    reference: dict[str, list[tuple[Any, ...]]] | None = None,
) -> Path:
    """A complete run directory: reference `ref` (`reference`, by default REF_OUT) and the given
    candidates; 6 tokens per target with REF_OUT.

    expected: prompt id -> answer rule as stored (JSON, e.g. '{"contains": "t8"}'), for task accuracy."""
    wall_s = wall_s or {}
    targets = ["ref", *candidates]
    manifest = {
        "models": [{"name": "m"}],
        "targets": [{"name": t, "kind": "hf", "device": "cpu", "dtype": "float32"} for t in targets],
        "sampling": {"max_tokens": 3, "logprobs": 1},
        **({"gates": gate_specs} if gate_specs else {}),
    }
    prov = {"hostname": "node-1", "device": "cpu", "device_name": "Test CPU", **(versions or {"vllm": "0.1"})}
    prov |= {"weights_sha256": "0123456789abcdef", "model_dir": str(model_dir) if model_dir else None}
    info = {"run_id": run_dir.name, "reference": "ref", "manifest_path": "test.yaml", "manifest_sha256": "ab" * 32,
            "manifest_resolved": manifest, "driver": {"python": "3.11", "polars": pl.__version__},
            "provenance": {f"m/{t}": prov for t in targets}}  # fmt: skip
    store = RunStore.create(run_dir, info)
    _write_target(store, "ref", reference or REF_OUT, wall_s=wall_s.get("ref", 1.0), expected=expected)
    for name, outputs in candidates.items():
        _write_target(store, name, outputs, wall_s=wall_s.get(name, 0.5), expected=expected)
    store.update_info(status="partial" if failures else "complete", finished_at="now", failures=failures or {})
    return run_dir


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    a = write_run(tmp_path / "a", {"cand": SAME}, wall_s={"cand": 0.5})
    # B: cand diverges and is twice as fast; a second candidate appears; vLLM was upgraded.
    b = write_run(tmp_path / "b", {"cand": DIVERGED, "cand2": SAME}, wall_s={"cand": 0.25}, versions={"vllm": "0.2"})
    return a, b


GATES = gates.parse(
    [
        {"metric": "seq_match_rate", "op": ">=", "threshold": 1.0},
        {"metric": "first_top1_agreement", "op": ">=", "threshold": 1.0},
    ]
)


def _row(frame: pl.DataFrame, target: str, metric: str) -> dict[str, Any]:
    rows = frame.filter((pl.col("target") == target) & (pl.col("metric") == metric)).to_dicts()
    assert len(rows) == 1, rows
    return rows[0]


def test_metric_deltas_and_direction(two_runs: tuple[Path, Path]) -> None:
    frame = compare.compare(*two_runs)
    # seq match: A 2/2 = 1, B 1/2 (p2 diverges) -> delta -0.5, worse.
    seq = _row(frame, "cand", "seq_match_rate")
    assert (seq["a"], seq["b"], seq["delta"], seq["direction"]) == (1.0, 0.5, -0.5, "worse")
    # token match: A 6/6; B p1 3/3 + p2 2/3 (positions 0 and 2) = 5/6.
    tok = _row(frame, "cand", "token_match_rate")
    assert tok["b"] == pytest.approx(5 / 6) and tok["delta"] == pytest.approx(-1 / 6)
    # output tok/s: 6 tokens / 0.5 s = 12 in A, 6 / 0.25 s = 24 in B: +12, +100 %, better.
    tps = _row(frame, "cand", "output_tok_s")
    assert (tps["a"], tps["b"], tps["delta"], tps["rel_delta"], tps["direction"]) == (12.0, 24.0, 12.0, 1.0, "better")
    # An unchanged metric has no direction.
    assert _row(frame, "cand", "first_top1_agreement")["direction"] is None
    assert _row(frame, "cand", "first_top1_agreement")["delta"] == 0.0


def test_target_in_one_run_only(two_runs: tuple[Path, Path]) -> None:
    row = _row(compare.compare(*two_runs), "cand2", "seq_match_rate")
    assert row["a"] is None and row["b"] == 1.0 and row["delta"] is None


def test_gate_changes(two_runs: tuple[Path, Path]) -> None:
    frame = compare.compare(*two_runs, gates=GATES)
    seq = _row(frame, "cand", "seq_match_rate")
    assert (seq["verdict_a"], seq["verdict_b"], seq["change"]) == ("PASS", "FAIL", "PASS -> FAIL")
    top1 = _row(frame, "cand", "first_top1_agreement")  # position 0 is the same token in both runs
    assert (top1["verdict_a"], top1["verdict_b"], top1["change"]) == ("PASS", "PASS", None)
    # cand2 exists only in B: its gates go from absent to PASS.
    assert _row(frame, "cand2", "seq_match_rate")["change"] == "none -> PASS"


def test_provenance_changes_and_render(two_runs: tuple[Path, Path]) -> None:
    env = compare.provenance_changes(*two_runs)
    assert env.filter(pl.col("key") == "vllm").select("scope", "a", "b").rows() == [
        ("m/cand", "0.1", "0.2"),
        ("m/cand2", None, "0.2"),  # a target new in B: its fields differ from nothing
        ("m/ref", "0.1", "0.2"),
    ]
    text = compare.render(compare.compare(*two_runs, gates=GATES), run_a=two_runs[0], run_b=two_runs[1])
    assert "m/cand: vllm: 0.1 -> 0.2" in text
    assert "## Gate changes: 3" in text
    assert "m/cand: seq_match_rate >= 1: PASS -> FAIL" in text
    assert "## m / cand" in text
    assert [
        "seq_match_rate",
        "1",
        "0.5",
        "-0.5",
        "[-1.0, 0.0]",
        "-0.5",
        "worse",
        "seq_match_rate >= 1",
        "PASS",
        "FAIL",
    ] in rows(text)


def _prompts_run(run_dir: Path, n_prompts: int, *, diverge_every: int = 0) -> Path:
    """A run of `n_prompts` prompts (3 tokens each) and one candidate `cand` whose teacher-forced
    logprobs drift by 0 to 3/16 nats per prompt; with `diverge_every`, every such prompt diverges at
    position 1 (token 3 for the reference's 8)."""
    reference, outputs = {}, {}
    for i in range(n_prompts):
        pid = f"q{i:03d}"
        reference[pid] = REF_OUT["p2"]
        drift = (i % 4) / 16  # multiples of 1/16: exact in float32
        out = [(tok, lp - drift, lp) for tok, lp in REF_OUT["p2"]]
        if diverge_every and i % diverge_every == 0:
            out[1] = (3, -0.75, -1.5)
        outputs[pid] = out
    return write_run(run_dir, {"cand": outputs}, reference=reference)


@pytest.mark.parametrize("stats", [False, True], ids=["token-rows", "prompt-stats"])
def test_parity_resample_with_every_prompt_drawn_once_is_the_report(tmp_path: Path, stats: bool) -> None:
    """Both ways the report computes parity (from prompt_stats, or from token rows for older runs)."""
    from test_report_aggregates import add_prompt_stats  # here: that module imports this one

    run = _prompts_run(tmp_path / "a", 12, diverge_every=3)
    if stats:
        add_prompt_stats(run)
    assert reader.covers(run, "prompt_stats", "tokens") == stats
    report = compare.report(run)
    assert report.prompts is not None
    assert (report.prompt_stats is not None) == stats  # then agreement and KL sums come from prompt_stats
    drawn = parity_resample.candidates(report.prompts, report.tokens, report.reference, stats=report.prompt_stats)
    (key, prompts), *_ = drawn.items()
    assert key == ("m", "cand") and prompts.n_prompts == 12
    measured = report.parity.row(0, named=True)
    once = np.ones((1, prompts.n_prompts), dtype=np.int64)
    # The logprobs are multiples of 1/16, so sums in any order are exact; r and KL take logs and roots.
    inexact = {"pearson_r", "kl_topk_mean"}
    for metric in parity_resample.RESAMPLED:
        assert measured[metric] is not None, metric
        expected = pytest.approx(measured[metric], rel=1e-12) if metric in inexact else measured[metric]
        assert prompts.figure(metric, once)[0] == expected, metric
    assert measured["real_divergences"] + measured["near_ties"] == 4  # the classified divergences are resampled
    with pytest.raises(ValueError, match="no resampled parity figure 'n_prompts'"):
        prompts.figure("n_prompts", once)


@pytest.mark.parametrize("stats", [False, True], ids=["token-rows", "prompt-stats"])
def test_a_run_compared_with_itself_moves_by_nothing(tmp_path: Path, stats: bool) -> None:
    """Two reports of the same rows differ in a few figures' last bits (Polars' threads order their
    sums): r came out 1e-16 apart, a delta `fleet compare` called better. Those are no change."""
    from test_report_aggregates import add_prompt_stats  # here: that module imports this one

    run = _prompts_run(tmp_path / "a", 40, diverge_every=3)
    if stats:
        add_prompt_stats(run)
    for _ in range(5):
        frame = compare.compare(run, run)
        assert frame.filter(pl.col("delta") != 0).is_empty() and frame["direction"].null_count() == frame.height


def test_parity_delta_interval_holds_the_delta_and_narrows_with_more_prompts(tmp_path: Path) -> None:
    widths = {}
    for n in (8, 32):
        a = _prompts_run(tmp_path / f"a{n}", n)
        b = _prompts_run(tmp_path / f"b{n}", n, diverge_every=4)  # a quarter of B's prompts diverge
        frame = compare.compare(a, b)
        for metric in ("seq_match_rate", "token_match_rate", "tf_mean_abs_logprob_diff", "tf_p99_abs_logprob_diff"):
            row = _row(frame, "cand", metric)
            assert row["delta"] != 0 and row["delta_ci_low"] <= row["delta"] <= row["delta_ci_high"], (n, row)
            widths[(n, metric)] = row["delta_ci_high"] - row["delta_ci_low"]
        assert _row(frame, "cand", "seq_match_rate")["delta"] == -0.25
        # Identical in both runs: no spread at all; the reference is no candidate and gets no parity interval.
        top1 = _row(frame, "cand", "first_top1_agreement")
        assert (top1["delta"], top1["delta_ci_low"], top1["delta_ci_high"]) == (0.0, 0.0, 0.0)
    for metric in ("seq_match_rate", "token_match_rate", "tf_mean_abs_logprob_diff"):
        assert widths[(32, metric)] < widths[(8, metric)], metric
