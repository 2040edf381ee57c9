"""Performance figures per model (and weights) x target x scenario x level, from the perf_requests and
perf_levels tables alone (Polars only: no engine, no torch).

Definitions (failed requests, those with an `error`, count in n_errors and nowhere else):

* qps = completed requests / level wall_s (first due to last done, from perf_levels);
* output_tok_s = output tokens / wall_s; total_tok_s = (prompt + output tokens) / wall_s;
* prefill_tok_s = sum(prompt tokens) / sum(TTFT): the prefill rate one request sees, prompt
  tokens weighted. At level 1 it is input_tokens / TTFT, the seeds' "prefill tok/s at 1K";
  at higher levels requests overlap, so it is not the engine's aggregate prefill capacity;
* ttft, tpot, e2e: mean and linear-interpolated p50/p90/p99 over completed requests (tpot is
  null for one-token outputs and left out);
* itl: over every inter-token gap of every completed request (token-weighted), where a chunk
  of k tokens contributed k gaps of gap/k (actors/perf.py), so itl_mean_s equals the
  token-weighted mean TPOT;
* queue_delay: sent - scheduled over every request: how far the load generator fell behind
  its schedule (or, capped by the level, how long arrivals waited for a free slot);
* engine_ttft_mean_s / engine_tpot_mean_s: the engine's own figures (vLLM request stats:
  TTFT from scheduled, so it excludes engine queueing; see engine_queue_mean_s), for comparison
  with the client-side ones.

* send_lag_p99_s: p99 over requests of send_lag_s = sent - when the request could go (its due time,
  and a free slot): the client behind its own schedule, whatever the target does; client_cpu_share:
  CPU seconds of the client's event-loop thread / wall_s (the busiest client's, when several), where
  1.0 is one whole core, all an asyncio loop can use. client_bound flags a run where the client may
  have set the pace: send_lag_p99_s > 25 ms or client_cpu_share > 0.9 (CLIENT_LAG_S, CLIENT_CPU_SHARE);
* probe: a sweep (actors/sweep.py) runs a level several times, one summary row per run; `sweep_curve`
  lays them out as rate -> goodput and finds the highest rate meeting the SLO.

* goodput, when the scenario sets an `slo`: a request is good when it completed and its ttft_s,
  tpot_s and e2e_s are each at most the limits set (a one-token output's tpot counts as 0);
  goodput_qps = good requests / wall_s, goodput_tok_s = their output tokens / wall_s, slo_share =
  good / all requests (failed ones included). This is vLLM 0.32's `--goodput` as
  vllm/benchmarks/serve.py `calculate_metrics` computes it: there tpot = (latency - ttft) /
  (output_len - 1), 0 for one-token outputs, latency = send to last token, ttft = send to first,
  a request good when every limit >= its value, request_goodput = good / benchmark duration; here
  tpot = (last - first) / (n - 1), the same quantity from the same timestamps.

A NaN among a figure's requests makes the figure null (fleet/analysis/missing.py), not the figure of the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import polars as pl

from fleet.analysis.missing import no_nan

if TYPE_CHECKING:
    from fleet.results.info import RunInfo

Frame = pl.DataFrame | pl.LazyFrame

KEYS = ["model", "model_weights", "target", "scenario", "level"]
RUN = [*KEYS, "probe"]  # one run of a level: a sweep runs a level several times (actors/sweep.py)
QUANTILES = (50, 90, 99)
# A run whose client may have set the pace rather than the target (see the module docstring).
CLIENT_LAG_S, CLIENT_CPU_SHARE = 0.025, 0.9


def _stats(column: str, name: str) -> list[pl.Expr]:
    col = pl.col(column)
    return [no_nan(col, col.mean()).alias(f"{name}_mean_s")] + [
        no_nan(col, col.quantile(q / 100, interpolation="linear")).alias(f"{name}_p{q}_s") for q in QUANTILES
    ]


def summary(
    requests: Frame,
    levels: Frame,
    slos: Mapping[str, Mapping[str, float | None]] | None = None,
    *,
    by: Sequence[str] = (),
) -> pl.DataFrame:
    """One row per (model, target, scenario, level, probe): rates, latency statistics, queueing delay;
    goodput for the scenarios `slos` names (scenario -> {ttft_s, tpot_s, e2e_s} limits). `by`:
    columns both tables have that split the rows further (run_id, over a results root's runs)."""
    keys = [*by, *RUN]
    done = pl.col("error").is_null()
    reqs = _runs(requests).with_columns(_good=met_slo(slos or {}))
    completed = reqs.filter(done)
    counts = reqs.group_by(keys).agg(
        n_requests=pl.len(),
        n_errors=(~done).sum().cast(pl.Int64),
        # Null, not 0, where the scenario sets no SLO: no goodput was asked for.
        _n_good=pl.when(pl.col("_good").is_not_null().any()).then(pl.col("_good").sum().cast(pl.Int64)),
        _good_tokens=pl.when(pl.col("_good").is_not_null().any()).then(
            pl.when(pl.col("_good")).then(pl.col("n_output_tokens")).otherwise(0).sum().cast(pl.Int64)
        ),
        slo_share=pl.col("_good").mean(),
        queue_delay_mean_s=no_nan(pl.col("queue_delay_s"), pl.col("queue_delay_s").mean()),
        queue_delay_max_s=no_nan(pl.col("queue_delay_s"), pl.col("queue_delay_s").max()),
        send_lag_p99_s=no_nan(pl.col("send_lag_s"), pl.col("send_lag_s").quantile(0.99, interpolation="linear")),
    )
    latency = completed.group_by(keys).agg(
        *_stats("ttft_s", "ttft"),
        *_stats("tpot_s", "tpot"),
        *_stats("e2e_s", "e2e"),
        n_completed=pl.len(),
        prompt_tokens=pl.col("n_prompt_tokens").cast(pl.Int64).sum(),
        output_tokens=pl.col("n_output_tokens").cast(pl.Int64).sum(),
        _ttft_sum=pl.col("ttft_s").sum(),
        engine_queue_mean_s=no_nan(pl.col("engine_queue_s"), pl.col("engine_queue_s").mean()),
        engine_ttft_mean_s=no_nan(pl.col("engine_ttft_s"), pl.col("engine_ttft_s").mean()),
        engine_tpot_mean_s=no_nan(pl.col("engine_tpot_s"), pl.col("engine_tpot_s").mean()),
    )
    itl = completed.select(*keys, "itl_s").explode("itl_s").group_by(keys).agg(*_stats("itl_s", "itl"))
    wall = _runs(levels).select(*keys, "request_rate", "wall_s", "client_cpu_s")
    per_s = pl.when(pl.col("wall_s") > 0)
    out = (
        wall.join(counts, on=keys, how="left")
        .join(latency, on=keys, how="left")
        .join(itl, on=keys, how="left")
        .with_columns(pl.col("n_completed").fill_null(0))
        .with_columns(
            qps=per_s.then(pl.col("n_completed") / pl.col("wall_s")),
            output_tok_s=per_s.then(pl.col("output_tokens") / pl.col("wall_s")),
            total_tok_s=per_s.then((pl.col("prompt_tokens") + pl.col("output_tokens")) / pl.col("wall_s")),
            prefill_tok_s=pl.when(pl.col("_ttft_sum") > 0).then(pl.col("prompt_tokens") / pl.col("_ttft_sum")),
            goodput_qps=per_s.then(pl.col("_n_good") / pl.col("wall_s")),
            goodput_tok_s=per_s.then(pl.col("_good_tokens") / pl.col("wall_s")),
            client_cpu_share=per_s.then(pl.col("client_cpu_s") / pl.col("wall_s")),
        )
        .with_columns(
            client_bound=(pl.col("send_lag_p99_s") > CLIENT_LAG_S) | (pl.col("client_cpu_share") > CLIENT_CPU_SHARE)
        )
    )
    stats = [f"{m}_{s}_s" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", *(f"p{q}" for q in QUANTILES))]
    columns = [
        *by, *KEYS, "request_rate", "n_requests", "n_completed", "n_errors", "wall_s",
        "qps", "output_tok_s", "total_tok_s", "prefill_tok_s", "goodput_qps", "goodput_tok_s", "slo_share",
        *stats,
        "queue_delay_mean_s", "queue_delay_max_s", "engine_queue_mean_s", "engine_ttft_mean_s", "engine_tpot_mean_s",
        "probe", "send_lag_p99_s", "client_cpu_share", "client_bound",
    ]  # fmt: skip
    return out.select(columns).sort(keys).collect()


def sweep_curve(scenarios: pl.DataFrame, min_share: Mapping[str, float]) -> pl.DataFrame:
    """The probes of each swept level (`summary` rows of the scenarios `min_share` names: scenario ->
    the share a rate must meet), in rate order: offered request_rate (null: the closed loop, at its
    qps), qps, goodput_qps, slo_share, meets (slo_share >= min_share) and best_rps, the level's
    highest passing rate (the closed loop counts at its qps; null when none passes)."""
    share = pl.col("scenario").replace_strict(min_share, default=None, return_dtype=pl.Float64)
    rate = pl.col("request_rate").fill_null(pl.col("qps"))
    curve = scenarios.filter(pl.col("scenario").is_in(list(min_share))).with_columns(
        offered_rps=rate, meets=(pl.col("slo_share") >= share).fill_null(False)
    )
    best = pl.when(pl.col("meets")).then(pl.col("offered_rps")).max().over(KEYS).alias("best_rps")
    columns = [*RUN, "request_rate", "offered_rps", "qps", "goodput_qps", "slo_share", "meets"]
    return curve.select(*columns, best).sort([*KEYS, "offered_rps"])


def first_runs(frame: Frame) -> pl.DataFrame:
    """Each level's rows of its first run (probe 0): a sweep's later probes are other offered rates
    (actors/sweep.py), which a level's figure, its baseline and its trend leave out."""
    return _runs(frame).filter(pl.col("probe") == 0).collect()


def _runs(frame: Frame) -> pl.LazyFrame:
    """`frame` with its run within the level: `probe`, 0 where null or absent (tables written before
    sweeps, and every level that is not one), and the client columns those tables lack, as nulls."""
    lazy = frame.lazy()
    names = lazy.collect_schema().names()
    absent = {"probe": pl.Int32, "send_lag_s": pl.Float64, "client_cpu_s": pl.Float64}
    lazy = lazy.with_columns(pl.lit(None, dtype).alias(c) for c, dtype in absent.items() if c not in names)
    return lazy.with_columns(pl.col("probe").fill_null(0).cast(pl.Int32))


def met_slo(slos: Mapping[str, Mapping[str, float | None]]) -> pl.Expr:
    """Per request: whether it met its scenario's SLO (null where the scenario sets none)."""
    good = pl.lit(None, dtype=pl.Boolean)
    for scenario, limits in slos.items():
        met = pl.col("error").is_null()
        for name, limit in limits.items():
            if limit is not None:
                value = pl.col(name).fill_null(0.0) if name == "tpot_s" else pl.col(name)  # one token: tpot 0
                met = met & (value <= limit).fill_null(False)
        good = pl.when(pl.col("scenario") == scenario).then(met).otherwise(good)
    return good


def slos(info: RunInfo) -> dict[str, dict[str, float | None]]:
    """Scenario -> its SLO limits, for the scenarios of a run that set one (what `summary` takes)."""
    return {s["name"]: s["slo"] for s in info.perf if s.get("slo")}
