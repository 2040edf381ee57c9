"""The drill-down through a whole run: HF on CPU, a tiny synthetic Llama, and two candidates that
are the reference's model with one part of one layer broken on purpose (`weight_noise.tensors`).
The drill-down must name that layer and that part, and the msprobe configuration it writes must
pass msprobe's own config loader and checker."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from fleet.analysis import drilldown
from fleet.analysis.noise_model import NoiseSpec
from fleet.report.drilldown import write_msprobe_configs
from fleet.results import reader
from fleet.run import driver

pytestmark = pytest.mark.engine

MANIFEST = textwrap.dedent(
    """
    models:
      - name: tiny
        source: {kind: synthetic, family: llama, seed: 11, hidden_size: 64, intermediate_size: 128,
                 num_layers: 4, num_heads: 4, num_kv_heads: 2, init_std: 0.1}
    prompts:
      four:
        - {id: a, prompt: "The capital of France is"}
        - {id: b, prompt: "Quantum computing is"}
        - {id: c, prompt: "Two plus two equals"}
        - {id: d, prompt: "The river flows to the sea because"}
    targets:
      - {name: hf-fp32, kind: hf, dtype: float32, num_cpus: 0.5}
      - name: broken-attn
        kind: hf
        dtype: float32
        num_cpus: 0.5
        weight_noise: {seed: 1, relative: 0.1, tensors: "model.layers.2.self_attn.*"}
      - name: broken-mlp
        kind: hf
        dtype: float32
        num_cpus: 0.5
        weight_noise: {seed: 2, relative: 0.1, tensors: "model.layers.0.mlp.*"}
    reference: hf-fp32
    sampling: {max_tokens: 12, logprobs: 5}
    drilldown: {max_prompts: 2}
    """
)


@pytest.fixture(scope="module")
def drill_run(local_ray: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("drill-run")
    (base / "m.yaml").write_text(MANIFEST)
    run_dir, outcome = driver.run(
        base / "m.yaml", results_dir=base / "results", run_id="drill", progress=False, drilldown_of=drilldown.points
    )
    assert not outcome.partial, (outcome.failures, outcome.failed_shards)
    return Path(run_dir)


def test_drilldown_names_the_broken_layer_and_part(drill_run: Path) -> None:
    info = reader.read_info(drill_run)
    table = reader.load(drill_run)["drilldown"].collect()
    # Reference, its float32 twin, and both hf candidates probed at every divergence's prefix.
    assert set(table["target"]) == {"hf-fp32", "broken-attn", "broken-mlp"}
    assert set(table.filter(pl.col("twin_dtype").is_not_null())["target"]) == {"hf-fp32"}
    assert {"attention", "mlp", "decoder", "embed", "norm"} <= set(table["kind"])
    curve = drilldown.curve(table, info.reference, spec=NoiseSpec.from_info(info))
    first = drilldown.first_exceeding(curve)
    own = first.filter(pl.col("target") == pl.col("diverging"))
    found = {(r["diverging"], r["first_layer"], r["first_kind"]) for r in own.iter_rows(named=True)}
    # Module layers.2 is probe layer 3 (1-based), layers.0 is layer 1.
    assert found == {("broken-attn", 3, "attention"), ("broken-mlp", 1, "mlp")}, own
    line = own.filter(pl.col("diverging") == "broken-attn")["finding"][0]
    assert "the error first exceeds precision at layer 3 (attention output)" in line
    # Before the broken part the candidate is bit-identical to the reference: error 0, within the twin's.
    # The probe ran at the divergence's prefix: the prompt + the output both share, up to `step`.
    requests = reader.load(drill_run)["requests"].filter(pl.col("target") == "hf-fp32").collect()
    ref_out = {r["prompt_id"]: r["prompt_token_ids"] + r["output_token_ids"] for r in requests.iter_rows(named=True)}
    probed = table.filter((pl.col("target") == "hf-fp32") & (pl.col("layer") == 0)).unique(["prompt_id", "step"])
    for r in probed.iter_rows(named=True):
        n_prompt = len(requests.filter(pl.col("prompt_id") == r["prompt_id"])["prompt_token_ids"][0])
        assert r["prompt_token_ids"] == ref_out[r["prompt_id"]][: n_prompt + r["step"]]
        assert r["positions"] == [n_prompt + r["step"] - 1]  # the position that picks the divergent token
    assert probed["step"].max() > 0  # a prefix that holds output tokens, not the prompt alone
    attn = curve.filter((pl.col("target") == "broken-attn") & (pl.col("diverging") == "broken-attn"))
    assert (attn.filter(pl.col("layer") < 3)["rel_l2"] == 0).all()
    assert (attn.filter(pl.col("exceeds"))["layer"] >= 3).all()


def test_msprobe_config_passes_msprobes_own_checks(drill_run: Path) -> None:
    from msprobe.pytorch.dump.debugger.debugger_config import DebuggerConfig
    from msprobe.pytorch.dump.pt_config import parse_json_config

    written = write_msprobe_configs(drill_run)
    assert written
    configs = {Path(p).parent.name: json.loads(Path(p).read_text()) for p in written}
    attn = configs["broken-attn"]
    assert attn["tensor"]["list"] == ["layers.1.", "layers.2.self_attn"] and attn["level"] == "mix"
    assert configs["broken-mlp"]["tensor"]["list"] == ["embed_tokens", "layers.0.mlp"]
    for path in written:
        common, task = parse_json_config(str(path), None)  # msprobe's loader: raises on a bad field
        checked = DebuggerConfig(common, task, None, None, None)  # and the checks PrecisionDebugger runs
        assert checked.task == "tensor" and checked.level == "mix"
        assert checked.step == [json.loads(Path(path).read_text())["step"][0]]


def test_report_shows_the_drilldown(drill_run: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fleet", "report", str(drill_run), "--html", str(drill_run / "r.html")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "## Drill-down: the layer where each real divergence starts" in proc.stdout
    assert "the error first exceeds precision at layer 3 (attention output)" in proc.stdout
    html = (drill_run / "r.html").read_text()
    assert "log10 rel L2 vs reference" in html
