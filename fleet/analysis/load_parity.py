"""Parity vs load: do a target's greedy outputs stay the same when its batch changes?

At each level of a perf scenario with `parity:`, its parity prompts were sent alone ("solo",
concurrency 1) and in the middle of the load ("load"), and the reference teacher-forced both
(fleet/contracts/perf_schema.py, LOAD_TABLES). Each (target, scenario, level, phase) is judged here exactly as
a parity candidate is, by the same functions on the same columns: real divergences and near ties
from the reference's greedy path (fleet/analysis/divergence.py, the noise model of
fleet/analysis/noise_model.py), teacher-forced p99 |dlogp|, and tie-aware first-token agreement.
The load outputs are also compared with the solo ones by the self-consistency rule
(fleet/analysis/consistency.py): where they part, a near tie or a real divergence the batch caused.
"""

from __future__ import annotations

import polars as pl

from fleet.analysis import consistency, divergence, noise_model
from fleet.analysis.noise_model import NoiseSpec
from fleet.analysis.parity import Frame

LEVEL = ["model", "target", "scenario", "level"]
COLUMNS = [
    *LEVEL, "n_prompts", "in_flight_mean", "real_divergences", "near_ties", "first_top1_agreement_excl_ties",
    "tf_p99_abs_logprob_diff", "noise", "solo_real_divergences", "solo_tf_p99_abs_logprob_diff",
    "delta_real_divergences", "delta_tf_p99", "paths_changed_vs_solo", "real_divergences_vs_solo",
]  # fmt: skip
_SEP = "\x1f"  # joins a level's keys into one candidate name for the parity functions
_PROMPT = ["model", "prompt_set", "prompt_id"]
_REQUEST_COLUMNS = ["model", "target", "prompt_set", "prompt_id", "output_token_ids"]
_TOKEN_COLUMNS = [
    "model", "target", "prompt_set", "prompt_id", "position", "token_id", "logprob", "topk_ids", "topk_logprobs",
    "ref_logprob", "ref_topk_ids", "ref_topk_logprobs", "twin_logprob",
]  # fmt: skip


def _labelled(frame: Frame) -> pl.LazyFrame:
    """Load rows with `target` as one candidate per (target, scenario, level, phase)."""
    label = pl.concat_str("target", "scenario", pl.col("level").cast(pl.String), "phase", separator=_SEP)
    return frame.lazy().with_columns(target=label)


def _unlabelled(frame: pl.DataFrame) -> pl.DataFrame:
    parts = pl.col("target").str.split(_SEP)
    return frame.with_columns(
        target=parts.list.get(0),
        scenario=parts.list.get(1),
        level=parts.list.get(2).cast(pl.Int32),
        phase=parts.list.get(3),
    )


def table(
    load_requests: Frame,
    load_tokens: Frame,
    requests: Frame,
    tokens: Frame,
    reference: str,
    *,
    spec: NoiseSpec | None = None,
    noise: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """`evaluate`'s table."""
    return evaluate(load_requests, load_tokens, requests, tokens, reference, spec=spec, noise=noise)[0]


def evaluate(
    load_requests: Frame,
    load_tokens: Frame,
    requests: Frame,
    tokens: Frame,
    reference: str,
    *,
    spec: NoiseSpec | None = None,
    noise: pl.DataFrame | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(table, prompts). The table: one row per (model, target, scenario, level), the columns of COLUMNS.
    The prompts: one row per parity prompt sent under load (PROMPT_COLUMNS), `real` whether it is a
    real divergence from the reference, `real_vs_solo` whether its load output parts from its solo
    one beyond the noise: the table's real_divergences and real_divergences_vs_solo per prompt, the
    unit `fleet compare` resamples them by.

    real_divergences, near_ties, first_top1_agreement_excl_ties, tf_p99_abs_logprob_diff and noise
    are the load outputs' figures against the reference (divergence.summary); solo_* the same for
    the outputs alone; delta_* load minus solo; paths_changed_vs_solo counts prompts whose load
    output differs from the solo one at all, real_divergences_vs_solo those of them beyond the
    noise (consistency.self_consistency). in_flight_mean: the scenario's own requests in flight
    when the parity prompts were sent.

    `noise` (model, target, noise: the parity table's) is each target's near-tie threshold at every
    level and phase, the one its parity rows were judged by, so that alone, under load and in the
    parity table one margin means one thing; a target without it (no parity rows, `parity: false`)
    gets the noise model's over its own load rows.
    """
    spec = spec or NoiseSpec()
    load_req = _labelled(load_requests).collect()
    if load_req.is_empty():
        level_keys = {"model": pl.String, "target": pl.String, "scenario": pl.String, "level": pl.Int32}
        prompts = {
            **level_keys,
            "prompt_set": pl.String,
            "prompt_id": pl.String,
            "real": pl.Boolean,
            "real_vs_solo": pl.Boolean,
        }
        empty = pl.DataFrame(schema={**dict.fromkeys(COLUMNS, pl.Float64), **level_keys})
        return empty, pl.DataFrame(schema=prompts)
    ref_req = reference_requests(load_req, requests, reference)
    keys = ref_req.select(_PROMPT)
    ref_tok = (
        tokens.lazy()
        .filter(reference_rows(keys, reference))  # pushed down to the scan
        .join(keys.lazy(), on=_PROMPT, how="semi")
        .select(_TOKEN_COLUMNS)
    )
    req = pl.concat([ref_req, load_req.select(_REQUEST_COLUMNS)], how="vertical_relaxed")
    tok = pl.concat(
        [ref_tok.collect(), _labelled(load_tokens).select(_TOKEN_COLUMNS).collect()], how="vertical_relaxed"
    )
    labels = load_req.select("model", "target").unique()
    dtypes = {
        (m, label): spec.dtype(m, label.split(_SEP)[0]) for m, label in labels.iter_rows()
    }  # a level's candidate has its target's dtype
    level_spec = NoiseSpec(dtypes, spec.allowance, spec.near_tie_nats)
    table = noise_model.summary(tok, reference, level_spec)
    if noise is not None and spec.near_tie_nats is None:
        parity_noise = noise.select("model", _target="target", _noise="noise")
        table = (
            table.with_columns(_target=pl.col("target").str.split(_SEP).list.first())
            .join(parity_noise, on=["model", "_target"], how="left")
            .with_columns(noise=pl.coalesce("_noise", "noise"))
            .drop("_target", "_noise")
        )
    per_prompt = divergence.divergences(req, tok, reference, spec=level_spec, noise_table=table)
    summary = divergence.summary_of(per_prompt, tok, reference, noise_table=table)
    # Solo and load of one level are two variants of one base: compared with each other as matrix
    # variants are, by the same near-tie rule and the same noise.
    base = {label: label.rsplit(_SEP, 1)[0] for label in labels["target"].to_list()}
    compared = consistency.prompt_pairs(
        req.filter(pl.col("target") != reference),
        base,
        tokens=tok,
        noise=summary.select("model", "target", "noise"),
    )
    pairs = consistency.self_consistency_of(compared)
    pairs = _unlabelled(pairs.with_columns(target=pl.col("target_a")))
    return _assembled(_unlabelled(summary), pairs, load_req), _prompts(per_prompt, compared)


def reference_requests(load_requests: Frame, requests: Frame, reference: str) -> pl.DataFrame:
    """The reference's own greedy outputs (its rows, which the parity functions look for) of the
    load prompts only: its parity run may hold millions of other prompts in the same prompt set."""
    sent = load_requests.lazy().select(_PROMPT).unique().collect()
    of_sets = (pl.col("target") == reference) & pl.col("prompt_set").is_in(sent["prompt_set"].unique().implode())
    ref_req = (
        requests.lazy().filter(of_sets).join(sent.lazy(), on=_PROMPT, how="semi").select(_REQUEST_COLUMNS).collect()
    )
    if ref_req.is_empty():  # it has none of them (failed there; a replicated run renamed them): then one
        # of its prompts keeps the reference among the targets, matched by no load row, as all of them were.
        ref_req = requests.lazy().filter(of_sets).select(_REQUEST_COLUMNS).head(1).collect()
    return ref_req


def reference_rows(keys: pl.DataFrame, reference: str) -> pl.Expr:
    """A filter the Parquet reader applies, keeping (at least) the reference's rows of the prompts
    `keys` (_PROMPT columns); a semi join on the keys makes it exact."""
    return (
        (pl.col("target") == reference)
        & pl.col("prompt_set").is_in(keys["prompt_set"].unique().implode())
        & pl.col("prompt_id").is_in(keys["prompt_id"].unique().implode())
    )


PROMPT_COLUMNS = [*LEVEL, "prompt_set", "prompt_id", "real", "real_vs_solo"]


def _prompts(per_prompt: pl.DataFrame, compared: pl.DataFrame) -> pl.DataFrame:
    """Per load prompt, as the table counts them: a real divergence from the reference (the load
    phase's divergence.divergences), and from its solo output (the pair's prompt_pairs)."""
    on = [*LEVEL, "prompt_set", "prompt_id"]
    vs_solo = _unlabelled(compared.with_columns(target=pl.col("target_a"))).select(
        *on, real_vs_solo=(~pl.col("_near")).fill_null(False)
    )
    load = _unlabelled(per_prompt).filter(pl.col("phase") == "load")
    return (
        load.select(*on, real=(pl.col("kind") == "divergence").fill_null(False))
        .join(vs_solo, on=on, how="full", coalesce=True)
        .with_columns(pl.col("real", "real_vs_solo").fill_null(False))
        .select(PROMPT_COLUMNS)
        .sort(on)
    )


def _assembled(summary: pl.DataFrame, pairs: pl.DataFrame, load_req: pl.DataFrame) -> pl.DataFrame:
    figures = ["real_divergences", "near_ties", "first_top1_agreement_excl_ties", "tf_p99_abs_logprob_diff", "noise"]
    load = summary.filter(pl.col("phase") == "load").select(*LEVEL, *figures)
    solo = summary.filter(pl.col("phase") == "solo").select(
        *LEVEL,
        solo_real_divergences="real_divergences",
        solo_tf_p99_abs_logprob_diff="tf_p99_abs_logprob_diff",
    )
    vs_solo = pairs.select(
        *LEVEL,
        paths_changed_vs_solo=(pl.col("n_prompts") - pl.col("n_identical")).cast(pl.Int64),
        real_divergences_vs_solo=pl.col("real_divergences").cast(pl.Int64),
    )
    sent = (
        _unlabelled(load_req.filter(pl.col("target").str.ends_with(f"{_SEP}load")))
        .group_by(LEVEL)
        .agg(n_prompts=pl.len().cast(pl.Int64), in_flight_mean=pl.col("in_flight_sent").cast(pl.Float64).mean())
    )
    return (
        sent.join(load, on=LEVEL, how="left")
        .join(solo, on=LEVEL, how="left")
        .join(vs_solo, on=LEVEL, how="left")
        .with_columns(
            delta_real_divergences=pl.col("real_divergences") - pl.col("solo_real_divergences"),
            delta_tf_p99=pl.col("tf_p99_abs_logprob_diff") - pl.col("solo_tf_p99_abs_logprob_diff"),
        )
        .select(COLUMNS)
        .sort(LEVEL)
    )


def per_target(levels: pl.DataFrame) -> pl.DataFrame:
    """Per (model, target), the gate metrics: load_real_divergences, the most real divergences from
    the reference at any level under load; load_batch_real_divergences, the most load outputs that
    part from the same prompts alone beyond the noise, at any level."""
    return (
        levels.group_by("model", "target")
        .agg(
            load_real_divergences=pl.col("real_divergences").max().cast(pl.Int64),
            load_batch_real_divergences=pl.col("real_divergences_vs_solo").max().cast(pl.Int64),
        )
        .sort("model", "target")
    )
