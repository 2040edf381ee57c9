"""fleet.analysis against hand-computed cases (tiny frames built here, expected numbers derived in comments)."""

from __future__ import annotations

from math import exp, log
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet.analysis import parity as analysis
from fleet.analysis import throughput
from fleet.contracts import schema, stored_tables
from fleet.contracts.errors import UserError
from fleet.results import reader

REF, CAND = "hf", "vllm"


def _frame(arrow_schema: pa.Schema, rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Rows as a frame with exactly the table's columns and types (absent columns null)."""
    empty = pl.from_arrow(arrow_schema.empty_table())
    assert isinstance(empty, pl.DataFrame)
    return pl.DataFrame([{c: row.get(c) for c in empty.columns} for row in rows], schema=empty.schema)


def _req(target: str, pid: str, ids: list[int], **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "model_weights": "w",
        "target": target,
        "prompt_set": "s",
        "prompt_id": pid,
        "shard_id": "x",
        "output_token_ids": ids,
        **extra,
    }


def _tok(
    target: str,
    pid: str,
    pos: int,
    token: int,
    lp: float,
    *,
    topk: tuple[list[int], list[float]] | None = None,
    ref: tuple[float, list[int], list[float]] | None = None,
) -> dict[str, Any]:
    """A token row; topk defaults to [token] at lp (greedy: the token is its own top-1)."""
    ids, lps = topk or ([token], [lp])
    row = {"model": "m", "target": target, "prompt_set": "s", "prompt_id": pid, "position": pos, "token_id": token}
    row |= {"logprob": lp, "topk_ids": ids, "topk_logprobs": lps}
    if ref is not None:
        row |= {"ref_logprob": ref[0], "ref_topk_ids": ref[1], "ref_topk_logprobs": ref[2]}
    return row


def _binary_kl(p: float, q: float) -> float:
    """KL over the two outcomes {top-1, tail}: what kl_topk computes with k = 1."""
    return p * log(p / q) + (1 - p) * log((1 - p) / (1 - q))


# The main scenario: two prompts, three tokens each, k = 1. p1 is generated identically by both
# targets; p2 diverges at position 1 (ref 8, cand 3) and re-converges on token 9 at position 2.
# All logprobs are exact in float32 (multiples of 1/4), so hand arithmetic is exact.
REQUESTS = _frame(
    schema.REQUESTS,
    [_req(REF, "p1", [5, 6, 7]), _req(CAND, "p1", [5, 6, 7]), _req(REF, "p2", [5, 8, 9]), _req(CAND, "p2", [5, 3, 9])],
)
TOKENS = _frame(
    schema.TOKENS,
    [
        _tok(REF, "p1", 0, 5, -0.5),
        _tok(REF, "p1", 1, 6, -1.0),
        _tok(REF, "p1", 2, 7, -0.25),
        _tok(REF, "p2", 0, 5, -0.25),
        _tok(REF, "p2", 1, 8, -0.5),
        _tok(REF, "p2", 2, 9, -1.0),
        # Same prefix as the reference on p1, so teacher-forced values equal the reference's own.
        _tok(CAND, "p1", 0, 5, -0.75, ref=(-0.5, [5], [-0.5])),
        _tok(CAND, "p1", 1, 6, -1.0, ref=(-1.0, [6], [-1.0])),
        _tok(CAND, "p1", 2, 7, -0.5, ref=(-0.25, [7], [-0.25])),
        _tok(CAND, "p2", 0, 5, -0.25, ref=(-0.25, [5], [-0.25])),
        # Prefix [5] as the reference's: its top-1 is 8 (-0.5); it gives the candidate's 3 -1.5.
        _tok(CAND, "p2", 1, 3, -0.5, ref=(-1.5, [8], [-0.5])),
        # Prefix [5, 3]: the reference prefers 4 (-0.5) and gives 9 -1.0.
        _tok(CAND, "p2", 2, 9, -2.0, ref=(-1.0, [4], [-0.5])),
    ],
)


def test_first_step_matching_tokens() -> None:
    out = analysis.first_step(TOKENS, REF)
    assert out.columns == [
        "model", "target", "prompt_set", "prompt_id", "cand_token_id", "cand_logprob", "ref_token_id",
        "ref_logprob", "top1_match", "ref_logprob_of_cand", "logprob_diff", "p_ref", "p_cand", "rel_err",
    ]  # fmt: skip
    assert out["prompt_id"].to_list() == ["p1", "p2"]
    assert out["top1_match"].to_list() == [True, True]
    # p1: |-0.75 - -0.5| = 0.25; p2: both -0.25 -> 0.
    assert out["logprob_diff"].to_list() == pytest.approx([0.25, 0.0])
    assert out["p_ref"].to_list() == pytest.approx([exp(-0.5), exp(-0.25)])
    assert out["p_cand"].to_list() == pytest.approx([exp(-0.75), exp(-0.25)])
    # p1: |e^-0.75 - e^-0.5| / e^-0.5 = 1 - e^-0.25 = 0.221199...
    assert out["rel_err"].to_list() == pytest.approx([0.22119921692859512, 0.0])


def test_first_step_token_mismatch_uses_teacher_forced_logprob() -> None:
    tokens = _frame(
        schema.TOKENS,
        [_tok(REF, "p", 0, 5, -0.25), _tok(CAND, "p", 0, 6, -0.5, ref=(-1.5, [5], [-0.25]))],
    )
    row = analysis.first_step(tokens, REF).row(0, named=True)
    assert row["top1_match"] is False
    assert (row["ref_token_id"], row["ref_logprob"], row["cand_token_id"]) == (5, -0.25, 6)
    # Compared against the reference's logprob of the candidate's token 6 (-1.5), not of its own 5.
    assert row["ref_logprob_of_cand"] == -1.5
    assert row["logprob_diff"] == pytest.approx(1.0)
    # |e^-0.5 - e^-1.5| / e^-1.5 = e - 1
    assert row["rel_err"] == pytest.approx(1.718281828459045)


def test_sequences_divergence_and_positional_match() -> None:
    out = analysis.sequences(REQUESTS, REF)
    assert out.columns == [
        "model", "target", "prompt_set", "prompt_id", "n_ref", "n_cand",
        "exact_match", "tokens_matched", "tokens_total", "first_divergence",
    ]  # fmt: skip
    assert out["exact_match"].to_list() == [True, False]
    # p2 [5,3,9] vs [5,8,9]: positions 0 and 2 match (the re-converged 9 counts positionally).
    assert out["tokens_matched"].to_list() == [3, 2]
    assert out["tokens_total"].to_list() == [3, 3]
    assert out["first_divergence"].to_list() == [None, 1]


@pytest.mark.parametrize(
    ("ref_ids", "cand_ids", "matched", "total", "divergence"),
    [
        ([1, 2, 3, 4], [1, 2], 2, 4, 2),  # candidate shorter: diverges where it stops
        ([1, 2], [1, 2, 9], 2, 3, 2),  # candidate longer
        ([1, 2], [7, 2], 1, 2, 0),  # first token differs
        ([], [], 0, 0, None),  # both empty: identical
        ([1], None, 0, 1, 0),  # failed request: counts as empty
    ],
)
def test_sequences_lengths(
    ref_ids: list[int], cand_ids: list[int] | None, matched: int, total: int, divergence: int | None
) -> None:
    requests = _frame(schema.REQUESTS, [_req(REF, "p", ref_ids), _req(CAND, "p", cand_ids)])  # type: ignore[arg-type]
    row = analysis.sequences(requests, REF).row(0, named=True)
    assert (row["tokens_matched"], row["tokens_total"], row["first_divergence"]) == (matched, total, divergence)
    assert row["exact_match"] is (divergence is None)


def test_kl_topk_main_scenario() -> None:
    out = analysis.kl_topk(TOKENS, REF)
    assert out.columns == ["model", "target", "prompt_set", "prompt_id", "position", "kl"]
    assert out.height == 6  # candidate rows only; reference rows have no ref_topk
    # k = 1, so each KL is binary: KL(p_r || p_c) over {top-1, tail}.
    # p2/1: ref's 8 is outside the candidate's top-k [3] -> p_c(8) bound = e^-0.5 = p_r(8) -> 0.
    # p2/2: ref's 4 is outside [9] -> p_c(4) bound = e^-2.0.
    expected = [
        0.03618928595559037,  # _binary_kl(e^-0.5, e^-0.75)
        0.0,
        0.0673028470923416,  # _binary_kl(e^-0.25, e^-0.5)
        0.0,
        0.0,
        0.600002361833077,  # _binary_kl(e^-0.5, e^-2.0)
    ]
    assert out["kl"].to_list() == pytest.approx(expected, abs=1e-12)
    assert expected[0] == pytest.approx(_binary_kl(exp(-0.5), exp(-0.75)))


def _one_position(ref_ids: list[int], ref_p: list[float], cand_ids: list[int], cand_p: list[float]) -> float:
    tokens = _frame(
        schema.TOKENS,
        [
            _tok(REF, "p", 0, ref_ids[0], log(ref_p[0])),
            _tok(
                CAND, "p", 0, cand_ids[0], log(cand_p[0]),
                topk=(cand_ids, [log(p) for p in cand_p]),
                ref=(log(ref_p[0]), ref_ids, [log(p) for p in ref_p]),
            ),
        ],
    )  # fmt: skip
    kl = analysis.kl_topk(tokens, REF)["kl"].item()
    assert isinstance(kl, float)
    return kl


def test_kl_topk_identical_distributions_is_zero() -> None:
    assert _one_position([1, 2, 3], [0.5, 0.25, 0.125], [1, 2, 3], [0.5, 0.25, 0.125]) == pytest.approx(0.0, abs=1e-12)
    # Top-k holding all the mass: both tails floor at 1e-12 and cancel.
    assert _one_position([1, 2], [0.5, 0.5], [1, 2], [0.5, 0.5]) == pytest.approx(0.0, abs=1e-9)


def test_kl_topk_matches_by_id_not_by_slot() -> None:
    # Same set, probabilities swapped: 0.5 ln(0.5/0.3) + 0.3 ln(0.3/0.5) + 0.2 ln(0.2/0.2) = 0.2 ln(5/3).
    assert _one_position([1, 2], [0.5, 0.3], [2, 1], [0.5, 0.3]) == pytest.approx(0.10216512475319815, abs=1e-6)


def test_kl_topk_token_outside_candidate_topk() -> None:
    # Ref top-2 {1: 0.5, 2: 0.3}; candidate top-2 {1: 0.6, 3: 0.2}, so 2 is outside and gets the
    # bound p_c(2) = 0.2. tails: 1 - 0.8 = 0.2 both. KL = 0.5 ln(0.5/0.6) + 0.3 ln(0.3/0.2) = 0.030478754.
    assert _one_position([1, 2], [0.5, 0.3], [1, 3], [0.6, 0.2]) == pytest.approx(0.03047875403547201, abs=1e-6)


def test_kl_topk_bounds_can_exhaust_the_candidate_tail() -> None:
    # Ref top-3 {1: 0.5, 2: 0.25, 3: 0.125}; candidate top-2 {1: 0.5, 4: 0.45}. 2 and 3 get the
    # bound 0.45 each, so sum p_c = 1.4 and tail_c floors at 1e-12 while tail_r = 0.125:
    # 0.25 ln(0.25/0.45) + 0.125 ln(0.125/0.45) + 0.125 ln(0.125/1e-12)
    # = -0.146946666 - 0.160116731 + 3.193947447 = 2.886884050 (the floor's term dominates).
    kl = _one_position([1, 2, 3], [0.5, 0.25, 0.125], [1, 4], [0.5, 0.45])
    assert kl == pytest.approx(2.8868840498728012, abs=1e-6)


def test_parity_main_scenario() -> None:
    out = analysis.parity(REQUESTS, TOKENS, REF)
    assert out.equals(analysis.parity(REQUESTS.lazy(), TOKENS.lazy(), REF))  # LazyFrames too
    assert out.height == 1
    row = out.row(0, named=True)
    assert list(row) == [
        "model", "target", "n_prompts",
        "first_top1_agreement", "first_logprob_diff_mean", "first_prob_rel_err_mean",
        "seq_match_rate", "token_match_rate", "tokens_matched", "tokens_total",
        "pearson_r", "mae",
        "tf_top1_agreement", "tf_max_abs_logprob_diff", "tf_mean_abs_logprob_diff",
        "first_divergence_mean", "n_diverged", "kl_topk_mean",
    ]  # fmt: skip
    assert (row["model"], row["target"], row["n_prompts"]) == ("m", CAND, 2)
    assert row["first_top1_agreement"] == 1.0
    assert row["first_logprob_diff_mean"] == pytest.approx(0.125)  # (0.25 + 0) / 2
    assert row["first_prob_rel_err_mean"] == pytest.approx(0.11059960846429756)  # (1 - e^-0.25) / 2
    assert row["seq_match_rate"] == 0.5
    assert (row["tokens_matched"], row["tokens_total"]) == (5, 6)
    assert row["token_match_rate"] == pytest.approx(5 / 6)
    # Common prefix: p1 positions 0-2 and p2 position 0 -> (cand, ref) pairs
    # (-0.75, -0.5), (-1, -1), (-0.5, -0.25), (-0.25, -0.25). MAE = (0.25 + 0 + 0.25 + 0) / 4.
    # Deviations from the means (-0.625, -0.5): dx = [-1/8, -3/8, 1/8, 3/8], dy = [0, -1/2, 1/4, 1/4];
    # sum dx dy = 5/16, sum dx^2 = 5/16, sum dy^2 = 3/8 -> r = (5/16) / sqrt(5/16 * 3/8) = sqrt(5/6).
    assert row["mae"] == pytest.approx(0.125)
    assert row["pearson_r"] == pytest.approx(0.9128709291752769)
    # Teacher-forced: ref top-1 equals the token except at p2/1 (8 vs 3) and p2/2 (4 vs 9) -> 4/6.
    assert row["tf_top1_agreement"] == pytest.approx(4 / 6)
    # |logprob - ref_logprob| = 0.25, 0, 0.25, 0, 1.0, 1.0 -> max 1.0, mean 2.5 / 6.
    assert row["tf_max_abs_logprob_diff"] == pytest.approx(1.0)
    assert row["tf_mean_abs_logprob_diff"] == pytest.approx(2.5 / 6)
    assert (row["first_divergence_mean"], row["n_diverged"]) == (1.0, 1)
    # Mean of the six per-position KLs in test_kl_topk_main_scenario.
    assert row["kl_topk_mean"] == pytest.approx(0.11724908248016815)


def test_parity_identical_candidate() -> None:
    requests = _frame(schema.REQUESTS, [_req(t, "p", [1, 2]) for t in (REF, CAND)])
    tokens = _frame(
        schema.TOKENS,
        [
            _tok(REF, "p", 0, 1, -0.5),
            _tok(REF, "p", 1, 2, -0.25),
            _tok(CAND, "p", 0, 1, -0.5, ref=(-0.5, [1], [-0.5])),
            _tok(CAND, "p", 1, 2, -0.25, ref=(-0.25, [2], [-0.25])),
        ],
    )
    row = analysis.parity(requests, tokens, REF).row(0, named=True)
    assert (row["seq_match_rate"], row["token_match_rate"], row["first_top1_agreement"]) == (1.0, 1.0, 1.0)
    assert (row["n_diverged"], row["first_divergence_mean"]) == (0, None)
    assert (row["mae"], row["tf_max_abs_logprob_diff"], row["tf_top1_agreement"]) == (0.0, 0.0, 1.0)
    assert row["pearson_r"] == pytest.approx(1.0)
    assert row["kl_topk_mean"] == pytest.approx(0.0, abs=1e-12)


def test_unknown_reference_is_refused() -> None:
    with pytest.raises(UserError, match="reference target 'nope' has no rows"):
        analysis.parity(REQUESTS, TOKENS, "nope")


def test_throughput() -> None:
    requests = _frame(
        schema.REQUESTS,
        [
            _req(REF, "a", [1], ttft_s=0.1, tpot_s=0.01, e2e_s=1.0),
            _req(REF, "b", [1], ttft_s=0.2, tpot_s=None, e2e_s=2.0),
            _req(REF, "c", [1], ttft_s=0.4, tpot_s=0.03, e2e_s=3.0),
            _req(CAND, "a", [1], ttft_s=0.5, tpot_s=None, e2e_s=0.5),  # 1-token outputs only
        ],
    )
    shards = _frame(
        schema.SHARDS,
        [
            {"model": "m", "target": REF, "prompt_set": "s", "shard_id": "0", "n_output_tokens": 100, "wall_s": 2.0},
            {"model": "m", "target": REF, "prompt_set": "s", "shard_id": "1", "n_output_tokens": 50, "wall_s": 1.0},
            {"model": "m", "target": CAND, "prompt_set": "s", "shard_id": "0", "n_output_tokens": 1, "wall_s": 0.5},
        ],
    )
    out = throughput.throughput(requests, shards)
    assert out.columns == [
        "model", "target", "n_requests", "output_tokens", "wall_s", "output_tok_s",
        "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
        "e2e_p50_s", "e2e_p90_s", "e2e_p99_s",
    ]  # fmt: skip
    ref, cand = out.rows(named=True)  # sorted by target: "hf" < "vllm"
    assert (ref["target"], cand["target"]) == (REF, CAND)
    assert (ref["n_requests"], ref["output_tokens"], ref["wall_s"]) == (3, 150, 3.0)
    assert ref["output_tok_s"] == pytest.approx(50.0)  # 150 / (2 + 1)
    # Linear quantile of sorted x at index (n - 1) q: ttft [0.1, 0.2, 0.4], p90 at 1.8 -> 0.2 + 0.8 * 0.2.
    assert [ref[f"ttft_p{q}_s"] for q in (50, 90, 99)] == pytest.approx([0.2, 0.36, 0.396])
    # tpot skips the null: [0.01, 0.03], p90 at 0.9 -> 0.01 + 0.9 * 0.02.
    assert [ref[f"tpot_p{q}_s"] for q in (50, 90, 99)] == pytest.approx([0.02, 0.028, 0.0298])
    assert [ref[f"e2e_p{q}_s"] for q in (50, 90, 99)] == pytest.approx([2.0, 2.8, 2.98])
    assert cand["tpot_p50_s"] is None
    assert (cand["ttft_p99_s"], cand["output_tok_s"]) == (0.5, 2.0)


def test_load(tmp_path: Path) -> None:
    part = tmp_path / "requests" / "m" / CAND / "shard-0.parquet"
    part.parent.mkdir(parents=True)
    pq.write_table(schema.conform(REQUESTS.filter(pl.col("target") == CAND).to_arrow(), schema.REQUESTS), part)
    frames = reader.load(tmp_path)
    assert sorted(frames) == sorted(stored_tables.all_tables())
    requests = frames["requests"].collect()
    assert requests.height == 2 and set(requests["target"]) == {CAND}
    # No tokens files: an empty frame that still has the table's columns and types.
    tokens = frames["tokens"].collect()
    assert tokens.height == 0 and tokens.schema == TOKENS.schema


def test_load_refuses_other_schema_version(tmp_path: Path) -> None:
    table = schema.conform(REQUESTS.to_arrow(), schema.REQUESTS)
    table = table.replace_schema_metadata({**table.schema.metadata, b"fleet.schema_version": b"999"})
    (tmp_path / "requests").mkdir()
    pq.write_table(table, tmp_path / "requests" / "x.parquet")
    with pytest.raises(UserError, match="schema version 999"):
        reader.load(tmp_path)
