"""Deep parity probes (fleet/analysis/probes.py, probe_metrics.py; actors/capture.py) and the feature matrix
(fleet/run/matrix.py).

Metric functions against hand-computed values; the Polars analysis on small built tables; then,
marked `engine`, the probes on real engines: HF float32 twice and bfloat16, vLLM CPU float32, one
engine each for the module, all on one tiny synthetic model.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from actors import capture as engine_probes
from actors.sources import resolver
from fleet.analysis import consistency, gates, probe_metrics, probes
from fleet.contracts import probe_schema
from fleet.contracts.errors import UserError
from fleet.run import matrix

KEY = {"model": "m", "model_weights": "w", "prompt_set": "s"}


# --- metrics on vectors ------------------------------------------------------------------------


def test_cosine_and_nmse_by_hand() -> None:
    a, b = np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])
    assert probe_metrics.cosine(b, a) == pytest.approx(17 / math.sqrt(14 * 21))
    assert probe_metrics.nmse(b, a) == pytest.approx(1 / 14)  # ||(0, 0, 1)||^2 / ||(1, 2, 3)||^2
    assert probe_metrics.cosine(a, a) == pytest.approx(1.0)
    assert math.isnan(probe_metrics.cosine(a, np.zeros(3)))


def test_kl_exact_by_hand() -> None:
    ref, cand = np.log([0.5, 0.5]), np.log([0.25, 0.75])
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # 0.143841
    assert probe_metrics.kl_exact(ref, cand) == pytest.approx(expected)
    # Each side is renormalised: an offset (an unnormalised float32 log-softmax) changes nothing.
    assert probe_metrics.kl_exact(ref + 3.0, cand - 1.0) == pytest.approx(expected)
    assert probe_metrics.kl_exact(ref, ref) == 0.0
    # Tokens the reference rules out contribute nothing; ones the candidate rules out, infinity.
    assert probe_metrics.kl_exact(np.array([0.0, -math.inf]), np.log([0.5, 0.5])) == pytest.approx(math.log(2))
    assert probe_metrics.kl_exact(np.log([0.5, 0.5]), np.array([0.0, -math.inf])) == math.inf


def test_logits_metrics_are_centred() -> None:
    ref = np.log(np.array([0.6, 0.2, 0.1, 0.05, 0.03, 0.02]))
    shifted = probe_metrics.logits_metrics(ref, ref + 5.0)  # another normaliser, the same distribution
    assert shifted["cosine"] == pytest.approx(1.0)
    assert shifted["nmse"] == pytest.approx(0.0, abs=1e-15)
    assert shifted["kl"] == pytest.approx(0.0, abs=1e-15)
    assert shifted["max_abs_err"] == pytest.approx(5.0)
    assert shifted["top1_match"] and shifted["top5_match"]
    swapped = probe_metrics.logits_metrics(ref, ref[[1, 0, 2, 3, 4, 5]])  # top two exchanged
    assert not swapped["top1_match"] and swapped["top5_match"] and swapped["top5_overlap"] == 1.0
    assert (swapped["ref_top1"], swapped["cand_top1"]) == (0, 1)
    last_out = probe_metrics.logits_metrics(ref, ref[[0, 1, 2, 3, 5, 4]])  # 5th and 6th exchanged
    assert last_out["top5_match"] is False and last_out["top5_overlap"] == pytest.approx(0.8)


def test_relative_error_shares_by_hand() -> None:
    ref = np.array([1.0, 100.0, 0.0, -2.0])
    cand = np.array([1.0005, 100.2, 1e-8, -2.02])  # rel errors 5e-4, 2e-3, 1e-8 / floor = 1e-2, 1e-2
    assert probe_metrics.rel_err_share(cand, ref, 1e-3) == pytest.approx(1 / 4)
    assert probe_metrics.rel_err_share(cand, ref, 5e-3) == pytest.approx(2 / 4)
    assert probe_metrics.rel_err_share(cand, ref, 5e-3, floor=1.0) == pytest.approx(3 / 4)  # 1e-8 / 1


def test_layer_metrics_by_hand() -> None:
    ref = np.array([[1.0, 0.0], [0.0, 1.0]])
    cand = np.array([[1.0, 0.0], [1.0, 1.0]])  # position 1 off by 45 degrees
    m = probe_metrics.layer_metrics(ref, cand)
    assert m["rel_l2"] == pytest.approx(1 / math.sqrt(2))
    assert m["cosine"] == pytest.approx((1 + 1 / math.sqrt(2)) / 2)
    assert m["cosine_min"] == pytest.approx(1 / math.sqrt(2))
    assert m["max_abs_err"] == 1.0
    assert m["within_0p1pct"] == pytest.approx(3 / 4)  # the 0 -> 1 element is off by 1 / floor


# --- tables ------------------------------------------------------------------------------------


def logits_frame(rows: dict[str, list[tuple[str, list[int], np.ndarray]]]) -> pl.DataFrame:
    """{target: [(prompt_id, prompt ids, [positions, vocab] logprobs), ...]} as PROBE_LOGITS rows."""
    tables = [
        engine_probes.logits_table(
            KEY | {"target": target},
            [engine_probes.LogitsRows(pid, ids, len(ids) - len(lp), lp) for pid, ids, lp in prompts],
        )
        for target, prompts in rows.items()
    ]
    frame = pl.from_arrow(pa.concat_tables(tables))
    assert isinstance(frame, pl.DataFrame)
    return frame


def test_logits_table_is_compact_and_typed() -> None:
    lp = np.log(np.full((2, 7), 1 / 7, dtype=np.float32))
    [table] = [engine_probes.logits_table(KEY | {"target": "t"}, [engine_probes.LogitsRows("a", [5, 6], 0, lp)])]
    assert table.schema.equals(probe_schema.PROBE_LOGITS, check_metadata=True)
    assert table.column("position").to_pylist() == [0, 1]
    assert table.column("logprobs").to_pylist() == [lp[0].tolist(), lp[1].tolist()]
    assert table.column("prompt_token_ids").to_pylist() == [[5, 6], [5, 6]]


def test_probe_tables_are_where_the_gates_look() -> None:
    assert set(probe_schema.PROBE_TABLES) == {"logits", "layers"}
    for metric in ("logits_cosine_min", "logits_kl_max", "layer_cosine_min", "layer_rel_l2_max"):
        assert gates.METRICS[metric][0] in probe_schema.PROBE_TABLES


def test_logits_errors_and_summary() -> None:
    rng = np.random.default_rng(0)
    ref = probe_metrics.log_normalize(rng.normal(size=(3, 50))).astype(np.float32)
    noisy = (ref + rng.normal(scale=0.01, size=ref.shape)).astype(np.float32)
    frame = logits_frame(
        {
            "ref": [("a", [1, 2, 3], ref), ("b", [4], ref[:1])],
            "same": [("a", [1, 2, 3], ref), ("b", [4], ref[:1])],
            "noisy": [("a", [1, 2, 3], noisy), ("b", [4], noisy[:1])],
            "other-input": [("a", [1, 2, 9], ref), ("b", [4], ref[:1])],
        }
    )
    errors = probes.logits_errors(frame, "ref")
    assert errors.height == 3 * 4  # 3 candidates x (3 positions of a + 1 of b)
    same = errors.filter(pl.col("target") == "same")
    assert same["cosine"].to_list() == pytest.approx([1.0] * 4)
    assert same["kl"].to_list() == pytest.approx([0.0] * 4, abs=1e-12)
    assert same["max_abs_err"].to_list() == [0.0] * 4
    noisy_a0 = errors.filter((pl.col("target") == "noisy") & (pl.col("prompt_id") == "a") & (pl.col("position") == 0))
    r, c = ref[0].astype(np.float64), noisy[0].astype(np.float64)
    assert noisy_a0["kl"].item() == pytest.approx(probe_metrics.kl_exact(r, c))
    assert noisy_a0["cosine"].item() == pytest.approx(probe_metrics.cosine(c - c.mean(), r - r.mean()))
    other = errors.filter(pl.col("target") == "other-input")
    assert other.filter(pl.col("prompt_id") == "a")["same_input"].to_list() == [False] * 3
    assert other.filter(pl.col("prompt_id") == "a")["cosine"].null_count() == 3

    summary = probes.logits_summary(errors).rows_by_key("target", named=True, unique=True)
    assert summary["same"]["logits_cosine_min"] == pytest.approx(1.0)
    assert summary["same"]["logits_kl_max"] == pytest.approx(0.0, abs=1e-12)
    assert summary["same"]["logits_top1_agreement"] == 1.0
    assert (summary["same"]["n_prompts"], summary["same"]["n_positions"]) == (2, 4)
    assert 0.99 < summary["noisy"]["logits_cosine_min"] < 1.0
    assert summary["noisy"]["logits_kl_max"] > 0
    # A pair not compared makes the summary null: a gate says "not measured", it does not pass.
    assert summary["other-input"]["n_input_mismatch"] == 3
    assert summary["other-input"]["logits_cosine_min"] is None

    with pytest.raises(UserError, match="reference target 'nope' has no rows"):
        probes.logits_errors(frame, "nope")


def layers_frame(rows: dict[str, list[np.ndarray]], ids: list[int] | None = None) -> pl.DataFrame:
    """{target: [hidden [positions, width] of layer 0, 1, ...]} for one prompt as PROBE_LAYERS rows."""
    tables = []
    for target, hidden in rows.items():
        n_pos = hidden[0].shape[0]
        kinds = ["embed"] + ["decoder"] * (len(hidden) - 2) + ["norm"]
        layer_rows = engine_probes.LayerRows(
            "p", ids or list(range(n_pos)), list(range(n_pos)), list(enumerate(kinds)), hidden
        )
        tables.append(engine_probes.layers_table(KEY | {"target": target}, [layer_rows]))
    frame = pl.from_arrow(pa.concat_tables(tables))
    assert isinstance(frame, pl.DataFrame)
    return frame


def test_layer_errors_curve_and_summary() -> None:
    rng = np.random.default_rng(1)
    ref = [rng.normal(size=(3, 8)) for _ in range(4)]
    drift = [h * (1 + 0.001 * i) + 0.01 * i * rng.normal(size=h.shape) for i, h in enumerate(ref)]
    frame = layers_frame({"ref": ref, "same": ref, "drift": drift})
    assert frame["hidden"].list.len().to_list() == [24] * 12
    errors = probes.layer_errors(frame, "ref")
    assert errors.height == 8 and errors["same_input"].all()
    curve = probes.layer_curve(errors)
    same = curve.filter(pl.col("target") == "same")
    assert same["rel_l2"].to_list() == [0.0] * 4 and same["cosine"].to_list() == pytest.approx([1.0] * 4)
    assert same["within_0p1pct"].to_list() == [1.0] * 4
    assert same["kind"].to_list() == ["embed", "decoder", "decoder", "norm"]
    grow = curve.filter(pl.col("target") == "drift")["rel_l2"].to_list()
    assert grow[0] == pytest.approx(0.0) and grow == sorted(grow)  # the error-growth curve
    r, c = ref[3], drift[3]
    assert grow[3] == pytest.approx(np.linalg.norm(c - r) / np.linalg.norm(r))
    summary = probes.layer_summary(curve).rows_by_key("target", named=True, unique=True)
    assert summary["same"]["layer_cosine_min"] == pytest.approx(1.0) and summary["same"]["layer_rel_l2_max"] == 0.0
    assert summary["drift"]["layer_rel_l2_max"] == pytest.approx(grow[3]) and summary["drift"]["worst_layer"] == 3
    assert summary["drift"]["layer_rel_l2_mean"] == pytest.approx(sum(grow) / 4)

    shorter = layers_frame({"ref": ref, "cut": [h[:2] for h in ref]})  # another prompt: not comparable
    assert (
        probes.layer_summary(probes.layer_curve(probes.layer_errors(shorter, "ref")))["layer_cosine_min"].item() is None
    )


def test_float_lists_and_dense_logprobs() -> None:
    column = engine_probes.float_lists([np.arange(6, dtype=np.float64).reshape(2, 3), np.array([7.5])])
    assert column.type == pa.list_(pa.float32()) and column.to_pylist() == [[0, 1, 2, 3, 4, 5], [7.5]]
    # vLLM FlatLogprobs with logprobs=-1: the sampled token first, then every token by rank.
    flat = SimpleNamespace(
        start_indices=[0, 0], end_indices=[0, 4], token_ids=[2, 1, 2, 0], logprobs=[-1.5, -0.5, -1.5, -2.0]
    )
    assert engine_probes.dense_logprobs(flat, 1, 3).tolist() == [-2.0, -0.5, -1.5]
    with pytest.raises(ValueError, match="all 4 tokens"):
        engine_probes.dense_logprobs(flat, 1, 4)


# --- feature matrix ----------------------------------------------------------------------------


def test_expand_names_and_nested_keys() -> None:
    base = {"name": "vllm-npu", "kind": "vllm", "engine_args": {"gpu_memory_utilization": 0.9}}
    grid = {
        "enforce_eager": [True, False],
        "tensor_parallel_size": [1, 2],
        "engine_args.enable_chunked_prefill": [True],
    }
    variants = matrix.expand(base | {"matrix": grid}, grid)
    assert [v["name"] for v in variants] == [
        "vllm-npu.enforce_eager-true.tensor_parallel_size-1.enable_chunked_prefill-true",
        "vllm-npu.enforce_eager-true.tensor_parallel_size-2.enable_chunked_prefill-true",
        "vllm-npu.enforce_eager-false.tensor_parallel_size-1.enable_chunked_prefill-true",
        "vllm-npu.enforce_eager-false.tensor_parallel_size-2.enable_chunked_prefill-true",
    ]
    assert variants[2]["enforce_eager"] is False and variants[2]["tensor_parallel_size"] == 1
    assert variants[0]["engine_args"] == {"gpu_memory_utilization": 0.9, "enable_chunked_prefill": True}
    assert "matrix" not in variants[0] and base["engine_args"] == {"gpu_memory_utilization": 0.9}  # copies
    [odd] = matrix.expand({"name": "t"}, {"engine_args.note": ["a b/c"]})
    assert odd["name"] == "t.note-a_b_c"


@pytest.mark.parametrize(
    ("target", "grid", "message"),
    [
        ({"name": "t", "dtype": "float32"}, {"dtype": ["bfloat16"]}, "set both in the target and in its matrix"),
        ({"name": "t"}, {"dtype": []}, "non-empty list"),
        ({"name": "t"}, {"dtype": ["a_b", "a b"]}, "duplicate variant names"),
        ({"name": "t", "engine_args": 3}, {"engine_args.x": [1]}, "is not a mapping"),
        ({"name": "t"}, {"name": ["x"]}, "'name' cannot vary"),
        ({"kind": "vllm"}, {"dtype": ["float32"]}, "needs a name"),
    ],
)
def test_expand_rejects(target: dict[str, Any], grid: dict[str, list[Any]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        matrix.expand(target, grid)


def test_self_consistency() -> None:
    expansion = matrix.expand_targets(
        [
            {"name": "ref", "kind": "hf"},
            {"name": "v", "kind": "vllm", "matrix": {"enforce_eager": [True, False], "dtype": ["float32", "bfloat16"]}},
        ]
    )
    assert [t["name"] for t in expansion.targets][:2] == ["ref", "v.enforce_eager-true.dtype-float32"]
    assert set(expansion.variants_of.values()) == {"v"} and len(expansion.variants_of) == 4
    eager32, eager16, graph32, graph16 = expansion.variants_of
    outputs = {
        eager32: {"a": [1, 2, 3], "b": [4, 5]},
        graph32: {"a": [1, 2, 3], "b": [4, 5]},
        eager16: {"a": [1, 2, 3], "b": [4, 6, 7]},
        graph16: {"a": [1, 2, 3], "b": [4, 6]},
    }
    requests = pl.DataFrame(
        [
            {"model": "m", "target": t, "prompt_set": "s", "prompt_id": p, "output_token_ids": ids}
            for t, by_prompt in outputs.items()
            for p, ids in by_prompt.items()
        ]
    )
    every_pair = consistency.self_consistency(requests, expansion.variants_of)
    assert every_pair.height == 6 and every_pair["differs_in"].null_count() == 6
    one_axis = consistency.self_consistency(requests, expansion.variants_of, settings=expansion.settings)
    rows = {r["differs_in"]: r for r in one_axis.iter_rows(named=True)}
    assert set(rows) == {
        "enforce_eager: true vs false",  # twice: at float32 and at bfloat16
        "dtype: float32 vs bfloat16",
    }
    assert one_axis.height == 4
    fp32 = one_axis.filter((pl.col("target_a") == eager32) & (pl.col("target_b") == graph32)).row(0, named=True)
    assert (fp32["n_prompts"], fp32["n_identical"], fp32["identical"], fp32["first_diff_prompt"]) == (2, 2, True, None)
    bf16 = one_axis.filter((pl.col("target_a") == eager16) & (pl.col("target_b") == graph16)).row(0, named=True)
    assert (bf16["n_identical"], bf16["identical"]) == (1, False)
    assert (bf16["first_diff_prompt"], bf16["first_diff_position"]) == ("s/b", 2)  # [4, 6, 7] vs [4, 6]


def test_self_consistency_judges_partings_by_the_near_tie_rule() -> None:
    """Two variants part on three prompts: at a near tie (the reference's margin between their
    tokens within the noise, each token in the other's top-k), beyond the noise, and by one output
    ending early. Only the last two are real divergences, and the per-variant gate metric counts them."""
    variants = {"v.tp-1": "v", "v.tp-2": "v"}
    settings = {"v.tp-1": {"tp": 1}, "v.tp-2": {"tp": 2}}
    outputs = {  # prompt -> (tp-1's tokens, tp-2's tokens)
        "tie": ([5, 7, 8], [5, 9, 8]),
        "real": ([5, 7, 8], [5, 9, 8]),
        "short": ([5, 7], [5]),
        "same": ([1, 2], [1, 2]),
    }
    requests = pl.DataFrame(
        [
            {"model": "m", "target": t, "prompt_set": "s", "prompt_id": p, "output_token_ids": ids[i]}
            for p, ids in outputs.items()
            for i, t in enumerate(variants)
        ]
    )
    # The reference's logprob of each side's token at the parting (position 1): 0.01 nats apart at
    # "tie", 2 nats apart at "real"; the noise is 0.1 nats for both variants.
    ref_lp = {("tie", 7): -0.70, ("tie", 9): -0.71, ("real", 7): -0.1, ("real", 9): -2.1}
    rows = []
    for p, ids in outputs.items():
        for i, t in enumerate(variants):
            for pos, tok in enumerate(ids[i]):
                lp = ref_lp.get((p, tok), -0.5) if pos == 1 else -0.5
                rows.append({"model": "m", "target": t, "prompt_set": "s", "prompt_id": p, "position": pos,
                             "token_id": tok, "ref_logprob": lp, "topk_ids": [7, 9, 8, 5]})  # fmt: skip
    tokens = pl.DataFrame(rows).lazy()
    noise = pl.DataFrame({"model": ["m", "m"], "target": list(variants), "noise": [0.1, 0.1]})
    [pair] = consistency.self_consistency(requests, variants, settings=settings, tokens=tokens, noise=noise).iter_rows(
        named=True
    )
    assert (pair["n_prompts"], pair["n_identical"], pair["n_near_ties"], pair["real_divergences"]) == (4, 1, 1, 2)
    assert pair["identical"] is False
    per_variant = consistency.per_variant(pl.DataFrame([pair]))
    assert dict(per_variant.select("target", "consistency_real_divergences").iter_rows()) == {"v.tp-1": 2, "v.tp-2": 2}
    # Which setting moved the outputs: tp-2's p99 is 0.05 nats above tp-1's with a 0.1 noise (within
    # it), but two greedy paths part beyond the noise, so the setting's effect is above the noise.
    parity = pl.DataFrame(
        {"model": ["m", "m"], "target": list(variants), "tf_p99_abs_logprob_diff": [0.02, 0.07]}
        | {"real_divergences": [0, 1], "noise": [0.1, 0.1]}
    )
    [effect] = consistency.effects(pl.DataFrame([pair]), parity).iter_rows(named=True)
    assert effect["setting"] == "tp" and effect["delta_tf_p99"] == pytest.approx(0.05)
    assert effect["effect_x_noise"] == pytest.approx(0.5) and effect["delta_real_divergences"] == 1
    assert (effect["paths_changed"], effect["effect"]) == (2, "above noise")
    calm = consistency.effects(pl.DataFrame([pair | {"real_divergences": 0}]), parity).row(0, named=True)
    assert calm["effect"] == "within noise"
    unjudged = consistency.self_consistency(requests, variants, settings=settings).row(0, named=True)
    assert unjudged["real_divergences"] is None and consistency.per_variant(pl.DataFrame([unjudged])).is_empty()


# --- on real engines ---------------------------------------------------------------------------

SYNTHETIC = {"seed": 7, "hidden_size": 128, "intermediate_size": 256, "num_layers": 4, "num_heads": 4}


def _prompts() -> list[Any]:
    from fleet.contracts.prompts import Message, Prompt

    return [
        Prompt(id="capital", prompt="The capital of France is"),
        Prompt(id="river", prompt="The river flows to the sea because"),
        Prompt(id="add", messages=[Message(role="user", content="What is 2 plus 2?")]),
    ]


@pytest.fixture(scope="module")
def model(fleet_cache: Path) -> Any:
    from fleet.contracts.engine import ResolvedModel
    from fleet.contracts.sources import SyntheticSource
    from fleet.contracts.spec import ModelSpec

    spec = ModelSpec(name="tiny", source=SyntheticSource(**SYNTHETIC, num_kv_heads=2, init_std=0.1))
    return ResolvedModel(spec, resolver(spec.source).local_dir(), "test", None)


def _hf(model: Any, name: str, dtype: str) -> Any:
    from actors.hf_reference import HFEngine
    from fleet.contracts.backend_args import HFArgs
    from fleet.contracts.spec import Sampling

    return HFEngine(HFArgs(name=name, dtype=dtype), model, sampling=Sampling(max_tokens=4))


@pytest.fixture(scope="module")
def hf_tables(model: Any) -> dict[str, pl.DataFrame]:
    """Both probes from HF float32 (twice, separate engines) and bfloat16: the 001 comparison."""
    layers, logits = [], []
    for name, dtype in (("hf-fp32", "float32"), ("hf-fp32-again", "float32"), ("hf-bf16", "bfloat16")):
        engine = _hf(model, name, dtype)
        layers.append(engine.probe_layers(_prompts(), prompt_set="s"))
        logits.append(engine.probe_logits(_prompts(), prompt_set="s", positions="all"))
        engine.shutdown()
    return {"layers": pl.from_arrow(pa.concat_tables(layers)), "logits": pl.from_arrow(pa.concat_tables(logits))}


@pytest.fixture(scope="module")
def vllm_engine(model: Any) -> Iterator[Any]:
    import vllm

    from actors.vllm_engine import VllmEngine
    from fleet.contracts.backend_args import CPU_ENV, VllmArgs
    from fleet.contracts.spec import Sampling

    real = vllm.LLM
    with pytest.MonkeyPatch.context() as mp:
        for key, value in CPU_ENV.items():
            mp.setenv(key, value)
        mp.delenv("VLLM_RPC_BASE_PATH", raising=False)  # the engine sets it in this process: unset after
        # Stands in for the constructor building with max_logprobs=-1 when the manifest asks for the probe.
        mp.setattr(vllm, "LLM", lambda **kw: real(**(kw | {"max_logprobs": -1})))
        args = VllmArgs(name="vllm-fp32", dtype="float32", max_model_len=256)
        engine = VllmEngine(args, model, sampling=Sampling(max_tokens=4))
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.mark.engine
def test_hf_layers_against_itself_and_bf16(hf_tables: dict[str, pl.DataFrame]) -> None:
    layers = hf_tables["layers"]
    one = layers.filter((pl.col("target") == "hf-fp32") & (pl.col("prompt_id") == "capital"))
    assert one["layer"].to_list() == list(range(6))  # embeddings, 4 decoder layers, final norm
    assert one["kind"].to_list() == ["embed", "decoder", "decoder", "decoder", "decoder", "norm"]
    assert one["hidden_size"].unique().to_list() == [128]
    assert one["n_positions"].item(0) == len(one["prompt_token_ids"].item(0))
    curve = probes.layer_curve(probes.layer_errors(layers, "hf-fp32"))
    again = curve.filter(pl.col("target") == "hf-fp32-again")
    assert again["rel_l2"].to_list() == [0.0] * 6 and again["cosine"].to_list() == pytest.approx([1.0] * 6, abs=1e-12)
    bf16 = curve.filter(pl.col("target") == "hf-bf16")
    print("\nbf16 vs fp32 per layer:\n" + str(bf16.select("layer", "kind", "rel_l2", "cosine", "within_0p1pct")))
    rel = bf16["rel_l2"].to_list()
    assert 0 < rel[0] < 0.004  # the embeddings: bfloat16 rounding of float32 weights alone (<= 2^-9)
    assert rel[-1] > rel[0] and max(rel) < 0.05
    assert bf16["cosine"].min() > 0.999
    summary = probes.layer_summary(curve).rows_by_key("target", named=True, unique=True)
    assert summary["hf-bf16"]["layer_cosine_min"] > 0.99 and summary["hf-fp32-again"]["layer_rel_l2_max"] == 0.0


@pytest.mark.engine
def test_hf_layer_indices_match_transformers(model: Any) -> None:
    """Row L + 1 is transformers' hidden_states[L] (the norm's output); row L, the norm's input."""
    import torch

    engine = _hf(model, "hf-fp32", "float32")
    prompt = _prompts()[0]
    rows = pl.from_arrow(engine.probe_layers([prompt], prompt_set="s"))
    _, ids = engine.render(prompt)
    with torch.inference_mode():
        reference = engine.net(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        norm = engine.net.get_decoder().norm

        def hidden(layer: int) -> torch.Tensor:
            return torch.tensor(rows.filter(pl.col("layer") == layer)["hidden"].item().to_list()).view(len(ids), -1)

        assert len(reference) == 5
        for layer in range(4):
            assert torch.equal(hidden(layer), reference[layer][0])
        assert torch.equal(hidden(5), reference[4][0])
        assert torch.allclose(norm(hidden(4)), hidden(5), atol=1e-6)
    assert getattr(engine.net.config, "tie_last_hidden_states", None) is None  # restored
    assert pl.from_arrow(engine.probe_layers([prompt], prompt_set="s", positions="last"))[
        "n_positions"
    ].unique().to_list() == [1]


@pytest.mark.engine
def test_hf_logits_probe_agrees_with_generate(model: Any, hf_tables: dict[str, pl.DataFrame]) -> None:
    from fleet.contracts.spec import Shard

    engine = _hf(model, "hf-fp32", "float32")
    last = pl.from_arrow(engine.probe_logits(_prompts(), prompt_set="s"))
    generated = engine.generate(Shard("tiny", "hf-fp32", "s", 0, tuple(_prompts()))).tokens
    first = pl.from_arrow(generated).filter(pl.col("position") == 0)
    for row, gen in zip(
        last.sort("prompt_id").iter_rows(named=True), first.sort("prompt_id").iter_rows(named=True), strict=True
    ):
        assert row["position"] == row["n_prompt_tokens"] - 1
        lp = np.array(row["logprobs"])
        assert lp.shape == (512,) and np.exp(lp.astype(np.float64)).sum() == pytest.approx(1.0, abs=1e-5)
        assert int(np.argmax(lp)) == gen["token_id"]
        assert lp[gen["topk_ids"]] == pytest.approx(gen["topk_logprobs"], abs=1e-5)
    every = hf_tables["logits"].filter(pl.col("target") == "hf-fp32")
    at_last = every.filter(pl.col("position") == pl.col("n_prompt_tokens") - 1).sort("prompt_id")
    assert np.allclose(
        np.stack(at_last["logprobs"].to_list()), np.stack(last.sort("prompt_id")["logprobs"].to_list()), atol=1e-5
    )


@pytest.mark.engine
def test_vllm_full_distribution_matches_hf(vllm_engine: Any, hf_tables: dict[str, pl.DataFrame]) -> None:
    table = vllm_engine.probe_logits(_prompts(), prompt_set="s", positions="all")
    assert table.schema.equals(probe_schema.PROBE_LOGITS, check_metadata=True)
    frame = pl.concat([hf_tables["logits"], pl.from_arrow(table)])
    errors = probes.logits_errors(frame, "hf-fp32")
    vllm = errors.filter(pl.col("target") == "vllm-fp32")
    assert vllm["same_input"].all()  # chat prompts rendered the same way by both engines
    assert vllm.height == hf_tables["logits"].filter(pl.col("target") == "hf-fp32").height
    summary = probes.logits_summary(errors).rows_by_key("target", named=True, unique=True)
    print("\nfull-distribution summary:\n" + str(probes.logits_summary(errors)))
    fp32, bf16 = summary["vllm-fp32"], summary["hf-bf16"]
    assert fp32["logits_cosine_min"] > 0.99999 and fp32["logits_kl_max"] < 1e-6
    assert fp32["logits_top1_agreement"] == 1.0 and fp32["logits_max_abs_err"] < 1e-3
    assert bf16["logits_kl_max"] > fp32["logits_kl_max"] and bf16["logits_cosine_min"] > 0.999
    last = pl.from_arrow(vllm_engine.probe_logits(_prompts(), prompt_set="s"))
    assert last.height == 3 and (last["position"] == last["n_prompt_tokens"] - 1).all()


@pytest.mark.engine
def test_vllm_probe_needs_an_engine_built_for_it(vllm_engine: Any) -> None:
    config = vllm_engine.llm.llm_engine.model_config
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config, "max_logprobs", 20)
        with pytest.raises(ValueError, match="max_logprobs=-1"):
            vllm_engine.probe_logits(_prompts(), prompt_set="s")


def test_long_prompts_score_on_their_cached_prefix_as_a_full_pass_does(model: Any) -> None:
    """Rows with a prompt over PREFIX_MIN tokens run only their output tokens on the prompt's
    cached KV (once per prompt, whichever candidate comes first); the figures are those of one
    full padded pass, to float32 rounding, for the reference and its twin alike."""
    import actors.hf_reference as hf

    engine = _hf(model, "hf-fp32", "float32")
    long_prompt = list(range(3, 3 + hf.PREFIX_MIN + 40))
    rows = [
        {"prompt_id": "long", "prompt_token_ids": long_prompt, "output_token_ids": [5, 9, 11, 7]},
        {"prompt_id": "long", "prompt_token_ids": long_prompt, "output_token_ids": [5, 9, 12]},  # another candidate's
        {"prompt_id": "short", "prompt_token_ids": [3, 4, 5], "output_token_ids": [6, 7]},
    ]
    table = engine.score(pa.Table.from_pylist(rows), k=3, twin="float32")
    order = [(r["prompt_id"], j) for r in rows for j in range(len(r["output_token_ids"]))]
    assert [(r["prompt_id"], r["position"]) for r in table.to_pylist()] == order  # the requests' order
    assert len(engine.prefixes) == 2  # the long prompt once for the reference, once for the twin
    full = engine._padded(rows[:2])  # what one full pass over prompt + output gives
    got = pl.from_arrow(table).filter(pl.col("prompt_id") == "long")["ref_logprob"].to_list()
    want = [float(full[0][j, t]) for j, t in enumerate(rows[0]["output_token_ids"])]
    want += [float(full[1][j, t]) for j, t in enumerate(rows[1]["output_token_ids"])]
    assert got == pytest.approx(want, abs=1e-5)
    twin = pl.from_arrow(table)["twin_logprob"].to_list()
    assert twin[:7] == pytest.approx(want, abs=1e-4)  # float32, the other attention kernel
    engine.shutdown()
