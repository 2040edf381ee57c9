"""The demo's gates tell a healthy port from a broken one, measured the way `fleet calibrate` does:
the same gates (manifests/demo.yaml) on healthy float32 vLLM copies and on mutants whose model
config is changed the way ports go wrong, through vLLM's own `hf_overrides`, or whose weights carry
seeded noise."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import polars as pl
import pytest
import yaml

pytestmark = pytest.mark.engine

ROOT = Path(__file__).parents[1]
MANIFEST = textwrap.dedent(
    """
    models:
      - name: tiny-llama
        source: {kind: synthetic, family: llama, seed: 7, hidden_size: 128, intermediate_size: 256,
                 num_layers: 2, num_heads: 4, num_kv_heads: 2, init_std: 0.1}
    prompts:
      quiz: {builtin: arith-knowledge}
    targets:
      - {name: hf-fp32, kind: hf, device: cpu, dtype: float32}
      - {name: vllm-fp32, kind: vllm, device: cpu, dtype: float32, max_model_len: 256}
    reference: hf-fp32
    sampling: {max_tokens: 12, logprobs: 5}
    run: {shard_size: 10}
    """
)


def test_the_demo_gates_pass_healthy_copies_and_catch_the_mutants(local_ray: object, tmp_path: Path) -> None:
    from fleet.report import calibrate

    demo = yaml.safe_load((ROOT / "manifests" / "demo.yaml").read_text())
    # Accuracy on a random tiny model is noise: keep the numerical gates, which are what a port breaks.
    numeric = [g for g in demo["gates"] if g["metric"] != "task_accuracy_delta"]
    path = tmp_path / "m.yaml"
    path.write_text(MANIFEST + yaml.safe_dump({"gates": numeric}))
    # One mutant per family (the demo's own calibration runs them all: docs/measurements.md): the suite's time.
    mutations = ["rms_norm_eps x100", "rope base x0.8", "logit scale x1.05", "weight noise 0.01", "activation swapped"]
    table, lines = calibrate.calibrate(
        path, results_dir=tmp_path / "results", run_id="cal", repeats=1, mutations=mutations
    )
    assert sorted(table.filter(pl.col("family").is_not_null())["mutation"]) == sorted(mutations)
    healthy = table.filter(pl.col("family").is_null())
    assert healthy.height == 1 and not healthy["caught"].any(), healthy
    caught = dict(table.filter(pl.col("family").is_not_null()).select("mutation", "caught").iter_rows())
    for mutation in ("rms_norm_eps x100", "rope base x0.8", "logit scale x1.05", "weight noise 0.01"):
        assert caught[mutation], (mutation, table)
    # The weight mutants loaded a noisy copy, and their provenance says so.
    [mutants] = (tmp_path / "results").glob("cal-mutants")
    prov = json.loads((mutants / "run.json").read_text())["provenance"]
    noisy = prov["tiny-llama/vllm-fp32.mutant-weight-noise-0.01"]
    assert noisy["weights_sha256"] != prov["tiny-llama/hf-fp32"]["weights_sha256"]
    assert "weight-noise" in noisy["model_dir"]
    # vLLM's llama runs silu only: the swapped activation is refused at start, listed, not counted.
    [refused] = table.filter(pl.col("mutation") == "activation swapped").to_dicts()
    assert refused["caught"] is None and refused["failed_gates"].startswith("did not start"), refused
    assert any(line.startswith("goal holds") for line in lines), lines
    # Per gate, what it catches on its own: the excess gate is the one that sees the small mutations.
    [excess] = [line for line in lines if line.startswith("gate tf_excess_ci_low <= 1: ")]
    assert "weight noise" in excess and "rope base" in excess, excess
    assert any(line.startswith("gate pearson_r >= 0.99: fails on") for line in lines), lines
    assert not any("cannot tell" in line for line in lines)  # init_std 0.1: peaked outputs


def test_a_nearly_flat_reference_is_said_to_test_nothing() -> None:
    from fleet.report import calibrate

    table = pl.DataFrame(
        {"candidate": ["v"], "family": [None], "caught": [False], "mutation": ["none (healthy)"], "size": [None]},
        schema_overrides={"family": pl.String, "size": pl.Float64},
    ).with_columns(dtype=pl.lit("float32"), tf_excess=pl.lit(0.1), tf_excess_ci_low=pl.lit(0.05))
    lines = calibrate.summary(table, p_top=0.004)  # a synthetic llama at the default init
    assert any("cannot tell a broken port on this model" in line and "0.004" in line for line in lines)
    assert not any("cannot tell" in line for line in calibrate.summary(table, p_top=0.6))


def test_an_unknown_mutation_is_one_clear_error_before_anything_runs(tmp_path: Path) -> None:
    from fleet.contracts.errors import UserError
    from fleet.report import calibrate

    with pytest.raises(UserError, match=r"unknown mutation 'rope bse x0.8'; did you mean 'rope base x0.8'"):
        calibrate.calibrate(
            ROOT / "manifests" / "demo.yaml", results_dir=tmp_path, run_id="x", repeats=1, mutations=["rope bse x0.8"]
        )
    assert not any(tmp_path.iterdir())
