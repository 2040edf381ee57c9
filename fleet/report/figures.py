"""The figures that compare each candidate with the reference prompt by prompt, as a report reads
them: from `prompt_stats` where every shard wrote them, else (a run written before them) the same
figures from the token rows (docs/architecture.md, "How a report scales"). Also the worst prompts
the per-prompt tables show, the noise floor of `repeat:` copies, and parity under load.

fleet.analysis computes; this module picks the source and the rows, for fleet.report.model.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl

from fleet.analysis import divergence, from_stats, load_parity, noise_floor, noise_model, stats_divergences
from fleet.analysis import parity as analysis
from fleet.analysis.noise_model import NoiseSpec
from fleet.results import reader

PROMPT = ["model", "prompt_set", "prompt_id"]  # a prompt of a model
CANDIDATE = ["model", "target", "prompt_set", "prompt_id"]  # ... and the candidate answering it

Figures = tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]  # parity, first step, divergences, sequences


def from_token_rows(requests: pl.DataFrame, tokens: pl.LazyFrame, ref: str, spec: NoiseSpec) -> Figures:
    """The token figures from the token rows: runs written before prompt_stats."""
    noise_table = noise_model.summary(tokens, ref, spec)  # the bootstrap once, for both
    per_prompt = divergence.divergences(requests, tokens, ref, spec=spec, noise_table=noise_table)
    ties = divergence.summary_of(per_prompt, tokens, ref, noise_table=noise_table)
    parity = analysis.parity(requests, tokens, ref).join(ties, on=["model", "target"], how="left")
    return parity, analysis.first_step(tokens, ref), per_prompt, analysis.sequences(requests, ref)


def from_prompt_stats(requests: pl.DataFrame, stats: pl.LazyFrame, ref: str, spec: NoiseSpec) -> Figures:
    """The same figures from prompt_stats: prompts joined with prompts (fleet/analysis/from_stats.py)."""
    return from_pairs(from_stats.Pairs.load(requests, stats, ref), stats, spec)


def from_pairs(pairs: from_stats.Pairs, stats: pl.LazyFrame, spec: NoiseSpec) -> Figures:
    """`from_prompt_stats` of prompts already paired."""
    first = from_stats.first_step(pairs)
    # The lists the divergences read are decoded while the per-candidate figures run in numpy, each
    # on a core of its own (docs/measurements.md, "fleet report ..., third pass").
    with ThreadPoolExecutor(1) as pool:
        found = stats_divergences.located(pairs)
        # The lists of every position, unless every divergence is its prompt's split.
        lists = None if found.at_splits else pool.submit(stats_divergences.at_divergence_lists, stats, pairs.reference)
        parity, noise_table, own = from_stats.figures(pairs, first, spec)
        per_prompt = stats_divergences.divergences(
            pairs, stats, spec, noise_table, lists=lists.result() if lists is not None else None, found=found
        )
    parity = parity.join(stats_divergences.summary_of(per_prompt, own, noise_table), on=["model", "target"], how="left")
    return parity, first, per_prompt, pairs.seq


def worst_first_steps(first: pl.DataFrame, top: int) -> pl.DataFrame:
    """The `top` largest first-step rel_err per candidate (ties: the earlier row, so the first in key order)."""
    # Row numbers sorted, then the picked rows gathered: sorting every row's columns moved 5M rows
    # of strings at 100M token rows (0.4-0.9 s, against 0.2-0.3 s).
    ranked = first.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"), "model", "target", "rel_err")
    ranked = ranked.sort("rel_err", descending=True, nulls_last=True, maintain_order=True)
    return first[ranked.group_by("model", "target", maintain_order=True).head(top)["_row"]].sort(CANDIDATE)


def worst_sequences(
    texts: pl.LazyFrame, reference: str, seqs: pl.DataFrame, per_prompt: pl.DataFrame, top: int
) -> pl.DataFrame:
    """The `top` worst prompts per candidate (divergence.worst) with analysis.answers (texts, match,
    correctness) and the prompt: texts are read and judged for the prompts shown only."""
    picked = divergence.worst(seqs, per_prompt, top)
    keys = picked.select(PROMPT).unique()
    # The filter reaches the Parquet reader, which then decodes the texts of those prompts only.
    ids = pl.col("prompt_id").is_in(keys["prompt_id"].implode())
    shown = texts.filter(ids).join(keys.lazy(), on=PROMPT, how="semi").collect()
    answers = analysis.answers(shown, reference)
    prompts = shown.filter(pl.col("target") == reference).select(*PROMPT, "prompt")
    return (
        answers.join(picked.drop("kind", "ref_margin", "noise"), on=CANDIDATE, how="inner")
        .join(prompts, on=PROMPT, how="left")
        .join(picked.select(*CANDIDATE, "kind", "ref_margin", "noise"), on=CANDIDATE, how="left")
        .sort(CANDIDATE)
    )


def shown(first: pl.DataFrame, sequences: pl.DataFrame) -> pl.DataFrame:
    """Per candidate: how many prompts it has and how many rows the per-prompt tables show."""
    counts = first.group_by("model", "target").agg(n_prompts=pl.len())
    n_shown = sequences.group_by("model", "target").agg(n_shown=pl.len())
    return counts.join(n_shown, on=["model", "target"], how="left").sort("model", "target")


def noise_floor_of(
    requests: pl.DataFrame,
    rows: pl.LazyFrame,
    repeats: dict[str, Any],
    *,
    stats: bool,
    pairs: from_stats.Pairs | None = None,
) -> pl.DataFrame:
    """noise_floor.self_parity from prompt_stats (`stats`; `pairs`: the candidates already paired)
    or, for runs before them, from token rows."""
    return (
        noise_floor.from_prompt_stats(requests, rows, repeats, pairs=pairs)
        if stats
        else noise_floor.self_parity(requests, rows, repeats)
    )


def load_parity_of(
    run_dir: str | Path,
    t: dict[str, pl.DataFrame],
    requests: pl.DataFrame,
    whole: pl.LazyFrame,
    ref: str,
    spec: NoiseSpec,
    parity: pl.DataFrame,
    *,
    stats: bool,
) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """Parity vs load and its prompts (None: no scenario with `parity:` ran), judged with each
    target's parity noise. `whole`: the tokens table; `stats`: prompt_stats covers it."""
    if not t["load_requests"].height:
        return None
    noise = parity.select("model", "target", "noise") if "noise" in parity.columns else None
    # The reference's rows of the load prompts, from the tokens files that hold them (prompt_stats,
    # written beside each, says which), not a scan of the key columns of every token row.
    keys = load_parity.reference_requests(t["load_requests"], requests, ref).select(PROMPT)
    where = load_parity.reference_rows(keys, ref)
    narrowed = reader.narrowed(run_dir, "tokens", index="prompt_stats", where=where) if stats else None
    tokens = whole if narrowed is None else narrowed
    return load_parity.evaluate(t["load_requests"], t["load_tokens"], requests, tokens, ref, spec=spec, noise=noise)
