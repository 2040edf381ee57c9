"""fleet.analysis.divergence: near ties vs real divergences, on hand-made frames."""

from __future__ import annotations

import polars as pl
import pytest
from test_analysis import CAND, REF, _frame, _req, _tok

from fleet.analysis import divergence, noise_model
from fleet.analysis.noise_model import NoiseSpec
from fleet.contracts import schema


def _run() -> tuple[pl.DataFrame, pl.DataFrame]:
    requests = _frame(
        schema.REQUESTS,
        [
            _req(REF, "same", [5, 6, 7]),
            _req(CAND, "same", [5, 6, 7]),
            # Leaves the path at position 1: the reference had 6 over 9 by 0.01 nats.
            _req(REF, "tie", [5, 6, 7]),
            _req(CAND, "tie", [5, 9, 7]),
            # Leaves the path at position 0 for a token the reference gives 4.9 nats less.
            _req(REF, "real", [1, 2]),
            _req(CAND, "real", [3, 2]),
            # Ends early: nothing to compare at the divergence, so never a tie.
            _req(REF, "short", [1, 2]),
            _req(CAND, "short", [1]),
        ],
    )
    rows = []
    for pid, ids in (("same", [5, 6, 7]), ("tie", [5, 6, 7]), ("real", [1, 2]), ("short", [1, 2])):
        rows += [_tok(REF, pid, i, t, -0.1) for i, t in enumerate(ids)]
    rows += [_tok(CAND, "same", i, t, -0.1, ref=(-0.1, [t], [-0.1])) for i, t in enumerate([5, 6, 7])]
    rows += [
        _tok(CAND, "tie", 0, 5, -0.1, ref=(-0.1, [5], [-0.1])),
        _tok(CAND, "tie", 1, 9, -0.68, topk=([9, 6], [-0.68, -0.70]), ref=(-0.70, [6, 9], [-0.69, -0.70])),
        _tok(CAND, "tie", 2, 7, -0.1, ref=(-0.1, [7], [-0.1])),
        _tok(CAND, "real", 0, 3, -0.2, topk=([3, 1], [-0.2, -2.0]), ref=(-5.0, [1, 3], [-0.1, -5.0])),
        _tok(CAND, "real", 1, 2, -0.1, ref=(-0.1, [2], [-0.1])),
        _tok(CAND, "short", 0, 1, -0.1, ref=(-0.1, [1], [-0.1])),
    ]
    return requests, _frame(schema.TOKENS, rows)


def test_classifies_first_divergences_with_a_set_tolerance() -> None:
    requests, tokens = _run()
    out = divergence.divergences(requests, tokens, REF, spec=NoiseSpec(near_tie_nats=0.05))
    kinds = dict(zip(out["prompt_id"], out["kind"], strict=True))
    assert kinds == {"same": "identical", "tie": "near tie", "real": "divergence", "short": "divergence"}
    tie = out.filter(pl.col("prompt_id") == "tie").row(0, named=True)
    assert tie["first_divergence"] == 1 and (tie["cand_token"], tie["ref_token"]) == (9, 6)
    assert tie["ref_margin"] == pytest.approx(0.01, abs=1e-6)  # -0.69 - (-0.70), float32 on disk
    assert tie["cand_in_ref_topk"] and tie["ref_in_cand_topk"]
    real = out.filter(pl.col("prompt_id") == "real").row(0, named=True)
    assert real["ref_margin"] == pytest.approx(4.9, abs=1e-6) and not real["near_tie"]


def test_a_margin_above_the_noise_is_a_divergence() -> None:
    requests, tokens = _run()
    out = divergence.divergences(requests, tokens, REF, spec=NoiseSpec(near_tie_nats=0.005))
    assert out.filter(pl.col("prompt_id") == "tie")["kind"].item() == "divergence"


def test_a_tie_needs_both_tokens_in_both_top_k() -> None:
    requests, tokens = _run()
    # The candidate's top-k without the reference's token 6: a flip it was sure of, not a tie.
    tokens = tokens.with_columns(
        topk_ids=pl.when((pl.col("prompt_id") == "tie") & (pl.col("position") == 1))
        .then(pl.lit([9], dtype=pl.List(pl.Int32)))
        .otherwise("topk_ids")
    )
    out = divergence.divergences(requests, tokens, REF, spec=NoiseSpec(near_tie_nats=1.0))
    assert out.filter(pl.col("prompt_id") == "tie")["kind"].item() == "divergence"


def test_the_candidates_own_error_never_widens_the_near_tie_threshold() -> None:
    requests, tokens = _run()
    # |dlogp| over the 9 scored candidate positions: 0 x7, 0.02 (tie), 4.8 (real). Its own p99,
    # linear: rank 0.99 * 8 = 7.92, between the two largest: 0.02 + 0.92 * (4.8 - 0.02) = 4.4176.
    [row] = divergence.noise(tokens, REF).to_dicts()
    assert row["tf_p99_abs_logprob_diff"] == pytest.approx(0.02 + 0.92 * 4.78, rel=1e-5)
    # That is a figure of the candidate, not its tolerance: with no twin the threshold is the
    # dtype's default (bfloat16: 0.13 nats), so the 0.01-nat flip is a near tie and a 0.5-nat one
    # would not be, however wrong the candidate is elsewhere.
    [model] = noise_model.summary(tokens, REF).to_dicts()
    assert model["noise"] == pytest.approx(0.13) and model["noise_source"].startswith("default for bfloat16")
    kinds = divergence.divergences(requests, tokens, REF).select("prompt_id", "kind").rows()
    assert dict(kinds) == {"real": "divergence", "same": "identical", "short": "divergence", "tie": "near tie"}
    wider = tokens.with_columns(
        ref_topk_logprobs=pl.when(pl.col("prompt_id") == "tie")
        .then(pl.lit([-0.19, -0.70], dtype=pl.List(pl.Float32)))
        .otherwise("ref_topk_logprobs")
    )
    out = divergence.divergences(requests, wider, REF)  # margin 0.51 nats > 0.13
    assert out.filter(pl.col("prompt_id") == "tie")["kind"].item() == "divergence"


def test_the_twin_sets_the_noise_and_the_allowance_scales_it() -> None:
    _, tokens = _run()
    twin = tokens.with_columns(
        twin_logprob=pl.when(pl.col("target") == CAND).then(pl.col("ref_logprob") + 0.2).cast(pl.Float32)
    )
    spec = NoiseSpec(dtypes={("m", CAND): "float32"}, allowance={"float32": 10.0})
    [row] = noise_model.summary(twin, REF, spec).to_dicts()
    assert row["twin_p99_abs_logprob_diff"] == pytest.approx(0.2, rel=1e-5)
    assert row["noise"] == pytest.approx(2.0, rel=1e-5) and row["noise_source"].startswith("precision twin (float32)")
    # 4.4 nats of its own p99 over 2.0 of noise.
    assert row["tf_excess"] == pytest.approx(4.4176 / 2.0, rel=1e-4)


def test_summary_counts_ties_apart() -> None:
    requests, tokens = _run()
    [row] = divergence.summary(requests, tokens, REF, spec=NoiseSpec(near_tie_nats=0.05)).to_dicts()
    assert (row["near_ties"], row["real_divergences"]) == (1, 2)
    # First token: same, tie (diverges at 1), short agree; real flips at 0 and is no tie.
    assert row["first_top1_agreement_excl_ties"] == pytest.approx(3 / 4)
    assert row["seq_match_rate_excl_ties"] == pytest.approx(2 / 4)


def _noisy_run(scale: float, prompts: int = 16, length: int = 40) -> pl.DataFrame:
    """A candidate whose |dlogp| is `scale` x its twin's, position by position (seeded noise)."""
    import numpy as np

    rng = np.random.default_rng(1)
    rows = [_tok(REF, "p0", 0, 1, -1.0)]
    for p in range(prompts):
        for i in range(length):
            twin = float(abs(rng.normal(0, 0.05)))
            cand = float(abs(rng.normal(0, 0.05))) * scale
            rows.append(_tok(CAND, f"p{p}", i, 1, -1.0 + cand, ref=(-1.0, [1], [-1.0])) | {"twin_logprob": -1.0 + twin})
    return _frame(schema.TOKENS, rows)


@pytest.mark.parametrize(("scale", "verdict"), [(1.0, "within"), (1.6, "exceeds precision")])
def test_the_excess_interval_tells_precision_from_a_bug(scale: float, verdict: str) -> None:
    [row] = noise_model.summary(_noisy_run(scale), REF, NoiseSpec(dtypes={("m", CAND): "bfloat16"})).to_dicts()
    assert row["tf_excess_ci_low"] < row["tf_excess"] < row["tf_excess_ci_high"]
    assert row["precision_verdict"].startswith(verdict), row


def test_a_partial_twin_compares_the_positions_it_scored() -> None:
    full = _noisy_run(1.0)
    [whole] = noise_model.summary(full, REF, NoiseSpec(dtypes={("m", CAND): "bfloat16"})).to_dicts()
    # The twin missing on one prompt (a failed twin shard): the others still give the noise, and the
    # candidate is measured on the same positions, not the whole target sent to the default.
    cut = full.with_columns(
        twin_logprob=pl.when(pl.col("prompt_id") == "p3").then(None).otherwise(pl.col("twin_logprob"))
    )
    [row] = noise_model.summary(cut, REF, NoiseSpec(dtypes={("m", CAND): "bfloat16"})).to_dicts()
    assert row["noise_source"] == "precision twin (bfloat16) x 1, on the 600 of 640 positions the twin scored"
    expected = noise_model.summary(
        cut.filter(pl.col("prompt_id") != "p3"), REF, NoiseSpec(dtypes={("m", CAND): "bfloat16"})
    )
    assert row["tf_excess"] == pytest.approx(expected["tf_excess"].item())
    assert row["tf_excess"] != pytest.approx(whole["tf_excess"])
