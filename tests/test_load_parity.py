"""Parity under load on real vLLM CPU engines (the session's `engine_run`: its perf scenario
`short` carries `parity: {prompt_set: eight}` at concurrency 1 and 4), checked against the stored
rows: the "parity vs load" figures are recomputed here from load_requests and load_tokens with
Polars alone, by the rule docs/load-parity.md states, not by the functions the report calls."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from fleet.analysis import load_parity
from fleet.analysis.noise_model import NoiseSpec
from fleet.contracts.gates import Gate
from fleet.report.model import RunReport
from fleet.results import reader

pytestmark = pytest.mark.engine

REF = "hf-fp32"
LEVEL = ["target", "level"]
ALLOWANCE = {"vllm-fp32": 10.0, "vllm-bf16": 1.0}  # parity.allowance's defaults: float32 10, 16-bit 1


@pytest.fixture(scope="module")
def tables(engine_run: Path) -> dict[str, pl.DataFrame]:
    return {name: frame.collect() for name, frame in reader.load(engine_run).items()}


def test_every_level_sent_the_parity_prompts_alone_and_under_load(tables: dict[str, pl.DataFrame]) -> None:
    req, tok = tables["load_requests"], tables["load_tokens"]
    counts = req.group_by("target", "scenario", "level", "phase").len().sort("target", "level", "phase")
    assert counts.rows() == [
        (t, "short", level, phase, 8)
        for t in ("vllm-bf16", "vllm-fp32")
        for level in (1, 4)
        for phase in ("load", "solo")
    ]
    # Alone: nothing else in flight; under load the scenario's own requests were in flight when sent.
    assert (req.filter(pl.col("phase") == "solo")["in_flight_sent"] == 0).all()
    loaded = req.filter(pl.col("phase") == "load")
    assert (loaded["in_flight_sent"] >= 1).all()
    assert loaded.filter(pl.col("level") == 4)["in_flight_sent"].max() > 1
    # Greedy with the run's sampling (32 tokens, top-5), the same prompt ids as the parity shards.
    assert (req["n_output_tokens"] <= 32).all() and (tok["topk_ids"].list.len() == 5).all()
    shards = (
        tables["requests"].filter(pl.col("prompt_set") == "eight").select("target", "prompt_id", "prompt_token_ids")
    )
    same = req.join(shards, on=["target", "prompt_id"], suffix="_shard")
    assert same.height == req.height and (same["prompt_token_ids"] == same["prompt_token_ids_shard"]).all()
    # Scored by the reference (teacher forcing, with the precision twin), like a candidate shard.
    assert tok["ref_logprob"].null_count() == 0 and tok["twin_logprob"].null_count() == 0
    assert tok.height == req["n_output_tokens"].sum()


def _parting(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ (the shorter length if one is a prefix of the
    other); None when equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _recomputed(tables: dict[str, pl.DataFrame]) -> pl.DataFrame:
    req, tok = tables["load_requests"], tables["load_tokens"]
    ref = tables["requests"].filter((pl.col("target") == REF) & (pl.col("prompt_set") == "eight"))
    keys = [*LEVEL, "phase"]
    diff = (pl.col("logprob").cast(pl.Float64) - pl.col("ref_logprob").cast(pl.Float64)).abs()
    twin = (pl.col("twin_logprob").cast(pl.Float64) - pl.col("ref_logprob").cast(pl.Float64)).abs()
    per_level = tok.group_by(keys).agg(tf_p99=diff.quantile(0.99, interpolation="linear"))
    # The near-tie threshold is the target's own from the parity table: its twin's p99 over every
    # parity position the reference scored, times the dtype's allowance.
    parity_tok = tables["tokens"].filter((pl.col("target") != REF) & pl.col("ref_logprob").is_not_null())
    noise = parity_tok.group_by("target").agg(noise=twin.quantile(0.99, interpolation="linear"))
    noise = noise.with_columns(noise=pl.col("noise") * pl.col("target").replace_strict(ALLOWANCE))
    per_level = per_level.join(noise, on="target")
    prompts = req.select(*keys, "prompt_id", "output_token_ids").join(
        ref.select("prompt_id", ref_ids="output_token_ids"), on="prompt_id"
    )
    at_ = pl.struct("output_token_ids", "ref_ids").map_elements(
        lambda r: _parting(r["output_token_ids"], r["ref_ids"]), return_dtype=pl.Int64
    )
    prompts = prompts.with_columns(at=at_)
    at = tok.select(
        *keys, "prompt_id", at=pl.col("position").cast(pl.Int64), tok="token_id", margin=(
            pl.col("ref_topk_logprobs").list.first().cast(pl.Float64) - pl.col("ref_logprob").cast(pl.Float64)
        ).clip(0.0), in_ref=pl.col("ref_topk_ids").list.contains(pl.col("token_id")), topk="topk_ids",
    )  # fmt: skip
    judged = (
        prompts.join(at, on=[*keys, "prompt_id", "at"], how="left")
        .join(per_level, on=keys)
        .with_columns(ref_tok=pl.col("ref_ids").list.get(pl.col("at"), null_on_oob=True))
        .with_columns(
            near=(
                (pl.col("margin") <= pl.col("noise"))
                & pl.col("in_ref")
                & pl.col("topk").list.contains(pl.col("ref_tok"))
            ).fill_null(False)
        )
    )
    counts = judged.group_by(keys).agg(
        real=(pl.col("at").is_not_null() & ~pl.col("near")).sum(),
        first_ok=(pl.col("at").is_null() | (pl.col("at") > 0) | pl.col("near")).mean(),
    )
    figures = counts.join(per_level, on=keys)
    load = figures.filter(pl.col("phase") == "load").drop("phase")
    solo = figures.filter(pl.col("phase") == "solo").select(*LEVEL, solo_real="real", solo_p99="tf_p99")
    outputs = req.pivot("phase", index=[*LEVEL, "prompt_id"], values="output_token_ids")
    changed = outputs.group_by(LEVEL).agg(changed=(pl.col("load") != pl.col("solo")).sum())
    return load.join(solo, on=LEVEL).join(changed, on=LEVEL).sort(LEVEL)


def test_parity_vs_load_rows_recompute_from_the_stored_tokens(
    engine_run: Path, tables: dict[str, pl.DataFrame]
) -> None:
    gates = [Gate(metric="load_real_divergences", op="<=", threshold=0, targets=["vllm-fp32"])]
    report = RunReport.build(engine_run, gates=gates)
    assert report.load_parity is not None
    shown = report.load_parity.sort(LEVEL)
    expected = _recomputed(tables)
    assert shown.select(LEVEL).rows() == expected.select(LEVEL).rows() == [
        ("vllm-bf16", 1), ("vllm-bf16", 4), ("vllm-fp32", 1), ("vllm-fp32", 4),
    ]  # fmt: skip
    assert shown["real_divergences"].to_list() == expected["real"].to_list()
    assert shown["solo_real_divergences"].to_list() == expected["solo_real"].to_list()
    assert shown["paths_changed_vs_solo"].to_list() == expected["changed"].to_list()
    for mine, theirs in (
        ("tf_p99_abs_logprob_diff", "tf_p99"), ("noise", "noise"), ("first_top1_agreement_excl_ties", "first_ok"),
    ):  # fmt: skip
        assert shown[mine].to_list() == pytest.approx(expected[theirs].to_list(), rel=1e-9, abs=1e-12)
    delta = (expected["tf_p99"] - expected["solo_p99"]).to_list()
    assert shown["delta_tf_p99"].to_list() == pytest.approx(delta, rel=1e-9, abs=1e-12)
    # float32 vLLM against float32 HF: float32 noise at every level, and no real divergence (the gate).
    fp32 = shown.filter(pl.col("target") == "vllm-fp32")
    assert (fp32["tf_p99_abs_logprob_diff"] < 1e-4).all() and (fp32["real_divergences"] == 0).all()
    assert report.verdicts is not None and report.verdicts["verdict"].to_list() == ["PASS"]
    # The section and its plot are there in every format.
    from fleet.report.html import render_html
    from fleet.report.sections import sections

    assert sections(report)["load_parity"].blocks
    assert "Parity vs load: TF p99 |dlogp| (nats) by concurrency, short" in render_html(report)


def test_parity_vs_load_reads_the_reference_rows_of_the_load_prompts_only(
    engine_run: Path, tables: dict[str, pl.DataFrame]
) -> None:
    """The reference's rows of other prompts (millions of token rows in a big run's parity set)
    change nothing; with none of the load prompts among its rows (a copy that renamed them), no
    level is judged against it, and the table is still made."""
    spec = NoiseSpec.from_info(reader.read_info(engine_run))
    load = (tables["load_requests"], tables["load_tokens"])
    req, tok = tables["requests"], tables["tokens"]
    full = load_parity.table(*load, req, tok, REF, spec=spec)
    sent = tables["load_requests"].select("model", "prompt_set", "prompt_id").unique()
    assert req.join(sent, on=["model", "prompt_set", "prompt_id"], how="anti").height  # other prompts exist
    only = load_parity.table(
        *load, *(t.join(sent, on=["model", "prompt_set", "prompt_id"], how="semi") for t in (req, tok)), REF, spec=spec
    )
    assert_frame_equal(only, full)
    renamed = [t.with_columns(pl.col("prompt_id") + "~0") for t in (req, tok)]
    unmatched = load_parity.table(*load, *renamed, REF, spec=spec)
    assert unmatched.select(LEVEL).rows() == full.select(LEVEL).rows()
    assert unmatched["real_divergences"].is_null().all() and unmatched["tf_p99_abs_logprob_diff"].is_null().all()
    assert unmatched["paths_changed_vs_solo"].to_list() == full["paths_changed_vs_solo"].to_list()  # load vs solo


def test_the_reference_rows_of_the_load_prompts_come_from_the_files_that_hold_them(
    engine_run: Path, tables: dict[str, pl.DataFrame], tmp_path: Path
) -> None:
    """The report reads the reference's rows of the load prompts from the tokens files whose
    prompt_stats twin lists them (reader.narrowed), not from a scan of every token row: the same
    rows, from fewer files; a run without prompt_stats beside its tokens gets no narrowed scan."""
    keys = load_parity.reference_requests(tables["load_requests"], tables["requests"], REF).select(
        "model", "prompt_set", "prompt_id"
    )
    where = load_parity.reference_rows(keys, REF)
    narrowed = reader.narrowed(engine_run, "tokens", index="prompt_stats", where=where)
    assert narrowed is not None
    order = ["target", "prompt_set", "prompt_id", "position"]
    found = narrowed.filter(where).collect().sort(order)
    assert found.height
    assert_frame_equal(found, tables["tokens"].filter(where).sort(order))
    files = {f.name for f in (engine_run / "tokens").rglob("*.parquet") if f"target={REF}" in str(f)}
    read = narrowed.select(pl.len()).collect().item()
    assert read < tables["tokens"].filter(pl.col("target") == REF).height and len(files) > 1
    # Without prompt_stats beside every tokens file (a run from before them): the caller scans it all.
    older = tmp_path / "older"
    shutil.copytree(engine_run, older)
    next(older.joinpath("prompt_stats").rglob("*.parquet")).unlink()
    assert reader.narrowed(older, "tokens", index="prompt_stats", where=where) is None
