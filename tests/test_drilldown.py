"""The drill-down without engines: its manifest section, its work plan, the first-layer rule on
known hidden states, and the msprobe configuration, checked by msprobe's own loader.
(tests/test_drilldown_run.py runs it end to end on HF engines.)"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fleet.analysis import drilldown
from fleet.analysis.noise_model import NoiseSpec
from fleet.contracts.errors import ManifestError
from fleet.contracts.spec import DrillPoint
from fleet.report.drilldown import config_path, modules, msprobe_config
from fleet.run.drill import drill_plans
from fleet.run.manifest_file import load

MANIFEST = textwrap.dedent(
    """
    models:
      - name: m
        source: {kind: synthetic, seed: 3}
    prompts:
      p: [{id: a, prompt: "one"}]
    targets:
      - {name: ref, kind: hf, dtype: float32}
      - {name: hf-bf16, kind: hf, dtype: bfloat16}
      - {name: vllm-bf16, kind: vllm, dtype: bfloat16}
      - {name: hf-fp16, kind: hf, dtype: float16}
    reference: ref
    DRILL
    """
)


def _load(tmp_path: Path, drill: str, reference: str = "ref") -> object:
    path = tmp_path / "m.yaml"
    path.write_text(MANIFEST.replace("DRILL", drill).replace("reference: ref", f"reference: {reference}"))
    return load(path)


def test_drilldown_section_validates(tmp_path: Path) -> None:
    m = _load(tmp_path, "drilldown: true")
    assert m.drilldown is not None and m.drilldown.margin == 2.0  # type: ignore[attr-defined]
    assert m.drilled() == ["hf-bf16", "hf-fp16"]  # type: ignore[attr-defined]
    assert _load(tmp_path, "drilldown: false").drilldown is None  # type: ignore[attr-defined]
    named = _load(tmp_path, "drilldown: {margin: 3, targets: [hf-bf16]}")
    assert named.drilled() == ["hf-bf16"]  # type: ignore[attr-defined]
    with pytest.raises(ManifestError, match=r"drilldown\.targets: 'vllm-bf16' is not a candidate that gives hidden"):
        _load(tmp_path, "drilldown: {targets: [vllm-bf16]}")
    with pytest.raises(ManifestError, match=r"drilldown: the reference 'vllm-bf16' is a 'vllm' target"):
        _load(tmp_path, "drilldown: true", reference="vllm-bf16")
    with pytest.raises(ManifestError, match="margin"):
        _load(tmp_path, "drilldown: {margin: 0.5}")
    with pytest.raises(ManifestError, match="marjin"):
        _load(tmp_path, "drilldown: {marjin: 3}")


def test_each_target_probes_the_divergences_it_can_explain(tmp_path: Path) -> None:
    m = _load(tmp_path, "drilldown: true")
    points = [
        DrillPoint("vllm-bf16", "p", "a", 3, (1, 2, 3, 4)),
        DrillPoint("hf-bf16", "p", "a", 1, (1, 2)),
        DrillPoint("hf-fp16", "p", "a", 0, (1,)),
    ]
    [plan] = drill_plans(m, {"m": points})  # type: ignore[arg-type]
    calls = {(c.target, c.twin): [p.diverging for p in c.points] for c in plan.drills}
    every = ["vllm-bf16", "hf-bf16", "hf-fp16"]
    # The reference, and its twin at each diverging dtype, at every divergence; an hf candidate at
    # its own, and at the vLLM target's (HF on the same card).
    assert calls == {
        ("ref", None): every,
        ("ref", "bfloat16"): every,
        ("ref", "float16"): every,
        ("hf-bf16", None): ["vllm-bf16", "hf-bf16"],
        ("hf-fp16", None): ["vllm-bf16", "hf-fp16"],
    }
    assert drill_plans(m, {"m": []}) == []  # type: ignore[arg-type]


KINDS = ["embed"] + [k for i in range(1, 5) for k in ("attention", "mlp", "decoder")] + ["norm"]
LAYERS = [0] + [i for i in range(1, 5) for _ in range(3)] + [5]


def _rows(target: str, twin: str | None, hidden: list[np.ndarray], *, step: int = 6) -> list[dict[str, object]]:
    return [
        {
            "model": "m", "model_weights": "w", "target": target, "prompt_set": "p", "prompt_id": "a",
            "diverging": "cand", "step": step, "twin_dtype": twin, "layer": layer, "kind": kind,
            "n_positions": 1, "hidden_size": h.size, "positions": [8], "prompt_token_ids": list(range(9)),
            "hidden": h.ravel().tolist(),
        }
        for layer, kind, h in zip(LAYERS, KINDS, hidden, strict=True)
    ]  # fmt: skip


def _states(broken_at: int | None, scale: float, seed: int) -> list[np.ndarray]:
    """Reference states plus noise of `scale` at every row, and 0.5 from row `broken_at` on."""
    ref = [np.random.default_rng(i).normal(size=(1, 16)) for i in range(len(KINDS))]
    rng = np.random.default_rng(seed)
    out = []
    for i, h in enumerate(ref):
        extra = 0.5 if broken_at is not None and i >= broken_at else scale
        out.append(h + extra * np.abs(h).mean() * rng.normal(size=h.shape))
    return out


def test_the_first_part_past_the_twin_is_named() -> None:
    ref = _states(None, 0.0, 0)
    twin = _states(None, 1e-3, 1)
    broken = _states(KINDS.index("mlp") + 3, 1e-3, 2)  # layer 2's MLP output
    rows = _rows("ref", None, ref) + _rows("ref", "bfloat16", twin) + _rows("cand", None, broken)
    frame = pl.DataFrame(rows, schema_overrides={"twin_dtype": pl.String, "step": pl.Int32, "layer": pl.Int32})
    spec = NoiseSpec(dtypes={("m", "cand"): "bfloat16"})
    curve = drilldown.curve(frame, "ref", spec=spec)
    assert curve["depth"].to_list() == list(range(len(KINDS)))
    assert curve.filter(pl.col("exceeds"))["depth"].min() == KINDS.index("mlp") + 3
    [first] = drilldown.first_exceeding(curve).to_dicts()
    assert (first["first_layer"], first["first_kind"], first["n_layers"]) == (2, "mlp", 4)
    assert first["finding"] == "prompt a diverges at token 6; the error first exceeds precision at layer 2 (MLP output)"
    # A candidate as close to the reference as the twin, by a factor the margin allows: nothing exceeds.
    healthy = _rows("ref", None, ref) + _rows("ref", "bfloat16", twin) + _rows("cand", None, _states(None, 1e-3, 3))
    frame = pl.DataFrame(healthy, schema_overrides={"twin_dtype": pl.String, "step": pl.Int32, "layer": pl.Int32})
    [none] = drilldown.first_exceeding(drilldown.curve(frame, "ref", spec=spec, margin=3.0)).to_dicts()
    assert none["first_layer"] is None and none["finding"].endswith("no layer's error exceeds precision")
    assert config_path(none) is None


def test_the_msprobe_config_is_what_msprobes_own_loader_accepts(tmp_path: Path) -> None:
    from msprobe.core.common.exceptions import MsprobeException
    from msprobe.pytorch.dump.debugger.debugger_config import DebuggerConfig
    from msprobe.pytorch.dump.pt_config import parse_json_config

    assert modules(14, "attention") == ["layers.12.", "layers.13.self_attn"]
    assert modules(1, "mlp") == ["embed_tokens", "layers.0.mlp"]
    assert modules(3, "decoder") == ["layers.1.", "layers.2."]
    assert modules(31, "norm") == ["layers.29.", "model.norm"] and modules(0, "embed") == ["embed_tokens"]
    row = {"model": "m", "diverging": "vllm/bf16", "prompt_set": "p", "prompt_id": "q 1", "step": 6}
    row |= {"first_layer": 14, "first_kind": "attention"}
    assert config_path(row) == "msprobe/m/vllm_bf16/p-q_1-step6.json"
    config = msprobe_config(row, dump_path="./dump")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    common, task = parse_json_config(str(path), None)
    checked = DebuggerConfig(common, task, None, None, None)
    assert (checked.task, checked.level, checked.step, checked.list) == (
        "tensor", "mix", [6], ["layers.12.", "layers.13.self_attn"]
    )  # fmt: skip
    # The checker does refuse what msprobe cannot run: the acceptance above means something.
    path.write_text(json.dumps(config | {"level": "L7"}))
    with pytest.raises(MsprobeException):
        parse_json_config(str(path), None)


def test_without_an_hf_candidate_the_report_says_what_to_add() -> None:
    from types import SimpleNamespace

    from fleet.report.sections import SECTIONS  # registers them
    from fleet.results.info import RunInfo

    ref = _states(None, 0.0, 0)
    rows = _rows("ref", None, ref) + _rows("ref", "bfloat16", _states(None, 1e-3, 1))
    frame = pl.DataFrame(rows, schema_overrides={"twin_dtype": pl.String, "step": pl.Int32, "layer": pl.Int32})
    spec = SECTIONS["drilldown"]
    report = SimpleNamespace(tables={"drilldown": frame}, info=RunInfo.of({"reference": "ref"}))
    [line] = spec.build(report, spec)  # type: ignore[arg-type]
    assert "Real divergences of cand were probed on the reference and its precision twin only" in str(line)
