"""The report's first screen: one row per target with its gate verdict, its distance from the
reference against the noise model, and its speed. Every format opens with it (fleet.report.text,
.markdown, .html), so "is this port OK, how far off, how fast" is answered before any detail.

`frame` is the data, one row per model x target (the manifest's order, failed targets included);
`section` lays it out with the headers of columns.SUMMARY and says what each figure counts.
"""

from __future__ import annotations

import polars as pl

from fleet.analysis.gates import expected_pairs
from fleet.report import columns
from fleet.report.blocks import Section, Table
from fleet.report.model import RunReport

TITLE = "Summary"
NO_GATES, REFERENCE = "no gates", "reference"  # the verdict of a target no gate checked
PARITY = ["tf_p99_abs_logprob_diff", "noise", "tf_excess", "tf_excess_ci_low", "tf_excess_ci_high"]
PARITY += ["first_top1_agreement_excl_ties", "seq_match_rate_excl_ties"]
PERF = ["output_tok_s", "ttft_p50_s"]
KEY = ["model", "target"]
MEANING = (
    "TF p99 |dlogp|: 99th percentile, over the teacher-forced positions, of |candidate - reference| logprob "
    "of the same token, in nats. Noise: what a correct port at the candidate's precision differs by (the "
    "reference's precision twin's p99 times the dtype's allowance). Excess: TF p99 / noise with its 95% "
    "bootstrap interval; an interval wholly above 1 is a bug, not precision. First top-1 and seq match: "
    "shares of prompts whose first token, and whole greedy output, equal the reference's, a divergence "
    "at a near tie (within the noise) counting as agreement."
)


def frame(report: RunReport) -> pl.DataFrame:
    """One row per model x target: verdict, failed_checks, the PARITY figures, tf_excess_ci and the
    figures of perf_levels (null where not measured, e.g. parity for the reference)."""
    pairs = list(dict.fromkeys([*expected_pairs(report.info), *_measured(report)]))
    pairs.sort(key=lambda p: (p[0], p[1] != report.reference))  # the reference first; else the manifest's order
    rows = pl.DataFrame(pairs, schema={"model": pl.String, "target": pl.String}, orient="row")
    parity = report.parity.select(
        *KEY, *(pl.col(c) if c in report.parity.columns else pl.lit(None, pl.Float64).alias(c) for c in PARITY)
    )
    perf, _ = perf_levels(report)
    out = rows.join(_verdicts(report), on=KEY, how="left").join(parity, on=KEY, how="left")
    out = out.join(perf, on=KEY, how="left").with_columns(
        verdict=pl.col("verdict").fill_null(
            pl.when(pl.col("target") == report.reference).then(pl.lit(REFERENCE)).otherwise(pl.lit(NO_GATES))
        ),
        # Null when any part is: the candidate was not measured against a noise model.
        tf_excess_ci=pl.format("{} ({}-{})", *(_fixed(pl.col(c)) for c in PARITY[2:5])),
    )
    return out


def perf_scenario(report: RunReport) -> str | None:
    """The scenario whose figures the summary shows: the manifest's first that ran; None: none ran."""
    if report.scenarios is None or report.scenarios.is_empty():
        return None
    named = [s["name"] for s in report.info.perf]
    ran = report.scenarios["scenario"].unique(maintain_order=True).to_list()
    return next((s for s in named if s in ran), ran[0])


def perf_levels(report: RunReport) -> tuple[pl.DataFrame, dict[str, str]]:
    """Per model x target: output_tok_s and ttft_p50_s at perf_scenario's lowest concurrency (with
    _top at its highest), else of the parity runs; and {column: where it was measured}."""
    scenario = perf_scenario(report)
    if report.scenarios is None or scenario is None:
        return report.throughput.select(*KEY, *PERF), dict.fromkeys(PERF, "(parity runs)")
    levels = report.scenarios.filter(pl.col("scenario") == scenario)
    low, top = min(levels["level"].to_list()), max(levels["level"].to_list())
    out = levels.filter(pl.col("level") == low).select(*KEY, *PERF)
    where = dict.fromkeys(PERF, f"@{low}")
    if top != low:  # one level: its figures once
        high = levels.filter(pl.col("level") == top).select(*KEY, *(pl.col(c).alias(f"{c}_top") for c in PERF))
        out = out.join(high, on=KEY, how="full", coalesce=True)
        where |= {f"{c}_top": f"@{top}" for c in PERF}
    return out, where


def section(report: RunReport) -> Section:
    """The summary table, what its figures count, and where the perf figures come from."""
    data, (_, where) = frame(report), perf_levels(report)
    headers = {c: h.format(at=where.get(c, "")) for c, h in columns.SUMMARY.items() if c in data.columns}
    if (scenario := perf_scenario(report)) is None:
        perf = "Perf: the parity runs (engine-side timestamps; no perf scenario ran)."
    else:
        levels = " and ".join(dict.fromkeys(w.lstrip("@") for w in where.values()))
        perf = f"Perf: scenario {scenario} at concurrency {levels} (client-side, streaming; every level below)."
    return Section("summary", TITLE, [Table(data, headers), MEANING, perf])


def _verdicts(report: RunReport) -> pl.DataFrame:
    """PASS or FAIL per model x target the gates checked, and how many of its checks failed."""
    schema = {"model": pl.String, "target": pl.String, "verdict": pl.String, "failed_checks": pl.String}
    v = report.verdicts
    if v is None or v.is_empty():
        return pl.DataFrame(schema=schema)
    failed = (pl.col("verdict") == "FAIL").sum()
    return v.group_by(KEY, maintain_order=True).agg(
        verdict=pl.when(failed > 0).then(pl.lit("FAIL")).otherwise(pl.lit("PASS")),
        failed_checks=pl.format("{}/{}", failed, pl.len()),
    )


def _fixed(value: pl.Expr) -> pl.Expr:
    """Two decimals, as the parity section's precision lines print the excess (0.20, not 0.2)."""
    return value.map_elements(lambda x: f"{x:.2f}", return_dtype=pl.String)


def _measured(report: RunReport) -> list[tuple[str, str]]:
    """Every model x target with a figure, in the order the tables have them."""
    frames = [report.throughput, report.parity, *([report.verdicts] if report.verdicts is not None else [])]
    return [(m, t) for f in frames for m, t in f.select(KEY).iter_rows()]
