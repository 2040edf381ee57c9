"""`repeat: N` targets and the noise floor they measure (fleet/run/matrix.py, fleet/analysis/noise_floor.py)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from test_analysis import _frame, _req, _tok
from test_manifest import GOOD, write

from fleet.analysis import noise_floor
from fleet.contracts import schema
from fleet.contracts.errors import ManifestError
from fleet.results import prompt_rows
from fleet.run.manifest_file import load
from fleet.run.plan import plan_shards


def test_repeat_adds_copies_that_run_like_the_original(tmp_path: Path) -> None:
    text = GOOD.replace("dtype: bfloat16}", "dtype: bfloat16, repeat: 3}")
    manifest = load(write(tmp_path, text))
    assert [t.name for t in manifest.targets] == ["ref", "cand", "cand.repeat-2", "cand.repeat-3"]
    assert manifest.repeats == {"cand.repeat-2": "cand", "cand.repeat-3": "cand"}
    copy = manifest.target("cand.repeat-2")
    assert copy.model_dump(exclude={"name"}) == manifest.target("cand").model_dump(exclude={"name"})
    shards = {s.target for s in plan_shards(manifest)}
    assert shards == {"ref", "cand", "cand.repeat-2", "cand.repeat-3"}


@pytest.mark.parametrize("value", ["0", "9", "two", "true", "1.5"])
def test_repeat_out_of_range_is_one_clear_error(tmp_path: Path, value: str) -> None:
    text = GOOD.replace("dtype: bfloat16}", f"dtype: bfloat16, repeat: {value}}}")
    with pytest.raises(ManifestError, match="repeat must be an integer from 1 to 8"):
        load(write(tmp_path, text))


def test_self_parity() -> None:
    copy = "vllm.repeat-2"
    requests = _frame(
        schema.REQUESTS,
        [_req("vllm", "a", [1, 2, 3]), _req(copy, "a", [1, 2, 3]), _req("vllm", "b", [4, 5]), _req(copy, "b", [4, 6])],
    )
    tokens = _frame(
        schema.TOKENS,
        [
            *(_tok("vllm", "a", i, t, lp) for i, (t, lp) in enumerate([(1, -0.5), (2, -0.25), (3, -1.0)])),
            *(_tok(copy, "a", i, t, lp) for i, (t, lp) in enumerate([(1, -0.5), (2, -0.5), (3, -1.0)])),
            *(_tok("vllm", "b", i, t, lp) for i, (t, lp) in enumerate([(4, -0.125), (5, -2.0)])),
            *(_tok(copy, "b", i, t, lp) for i, (t, lp) in enumerate([(4, -0.125), (6, -3.0)])),
        ],
    )
    [row] = noise_floor.self_parity(requests, tokens, {copy: "vllm"}).to_dicts()
    # The report's path over prompt_stats (one row per prompt, as the writer stores them) agrees.
    stats = pl.from_arrow(prompt_rows.summarize(tokens.to_arrow()))
    assert isinstance(stats, pl.DataFrame)
    assert noise_floor.from_prompt_stats(requests, stats.lazy(), {copy: "vllm"}).to_dicts() == [row]
    # Prompt a: identical, diffs 0, 0.25, 0; prompt b parts at 1, so only position 0 (diff 0) counts.
    assert (row["target"], row["copy"], row["n_prompts"]) == ("vllm", copy, 2)
    assert row["seq_identical_rate"] == 0.5 and row["tokens_compared"] == 4
    assert row["max_abs_logprob_diff"] == 0.25 and row["mean_abs_logprob_diff"] == pytest.approx(0.25 / 4)


def test_self_parity_without_the_copys_rows_is_empty() -> None:
    requests = _frame(schema.REQUESTS, [_req("vllm", "a", [1])])
    tokens = _frame(schema.TOKENS, [_tok("vllm", "a", 0, 1, -0.5)])
    assert noise_floor.self_parity(requests, tokens, {"vllm.repeat-2": "vllm"}).is_empty()


def test_self_parity_from_the_reports_pairs() -> None:
    """The report hands the noise floor its paired candidates (Pairs): two candidates' rows are then
    compared row for row, with the same figures as from the token rows, and where the requests are
    not in blocks it compares them as it would alone."""
    from fleet.analysis import from_stats

    copy = "vllm.repeat-2"
    outputs = {"a": ([1, 2, 3], [-0.5, -0.25, -1.0]), "b": ([4, 5], [-0.125, -2.0])}
    copies = {"a": ([1, 2, 3], [-0.5, -0.5, -1.0]), "b": ([4, 6], [-0.125, -3.0])}
    sides = {"ref": outputs, "vllm": outputs, copy: copies}
    requests = _frame(schema.REQUESTS, [_req(t, p, ids) for t, side in sides.items() for p, (ids, _) in side.items()])
    tokens = _frame(
        schema.TOKENS,
        [
            _tok(t, p, i, token, lp)
            for t, side in sides.items()
            for p, (ids, lps) in side.items()
            for i, (token, lp) in enumerate(zip(ids, lps, strict=True))
        ],
    )
    stats = pl.from_arrow(prompt_rows.summarize(tokens.to_arrow()))
    assert isinstance(stats, pl.DataFrame)
    expected = noise_floor.self_parity(requests, tokens, {copy: "vllm"})
    assert expected["tokens_compared"].to_list() == [4]
    for rows in (requests, requests.filter((pl.col("target") != copy) | (pl.col("prompt_id") != "b"))):
        pairs = from_stats.Pairs.load(rows, stats.lazy(), "ref")
        assert (pairs.request_row is not None) == (rows.height == requests.height)  # in blocks, or not
        found = noise_floor.from_prompt_stats(rows, stats.lazy(), {copy: "vllm"}, pairs=pairs)
        assert found.equals(noise_floor.from_prompt_stats(rows, stats.lazy(), {copy: "vllm"}))
        if rows.height == requests.height:
            assert found.equals(expected)


def test_a_null_logprob_counts_as_compared_but_not_in_the_figures() -> None:
    """A null inside a logprobs list (no value there) takes the frame path (prefix_pairs cannot
    tell it from NaN): it is a compared position, and the figures skip it, as from token rows."""
    copy = "vllm.repeat-2"
    requests = _frame(schema.REQUESTS, [_req("vllm", "a", [1, 2, 3]), _req(copy, "a", [1, 2, 3])])
    tokens = _frame(
        schema.TOKENS,
        [
            *(_tok("vllm", "a", i, t, lp) for i, (t, lp) in enumerate([(1, -0.5), (2, -0.25), (3, -1.0)])),
            *(_tok(copy, "a", i, t, lp) for i, (t, lp) in enumerate([(1, -0.75), (2, None), (3, -1.0)])),
        ],
    )
    stats = pl.from_arrow(prompt_rows.summarize(tokens.to_arrow()))
    assert isinstance(stats, pl.DataFrame)
    [row] = noise_floor.from_prompt_stats(requests, stats.lazy(), {copy: "vllm"}).to_dicts()
    assert row["tokens_compared"] == 3 and row["max_abs_logprob_diff"] == 0.25
    assert row["mean_abs_logprob_diff"] == pytest.approx(0.25 / 2)
    assert [row] == noise_floor.self_parity(requests, tokens, {copy: "vllm"}).to_dicts()
