"""Throughput and latency of a parity run, per (model, target), from its requests' engine-side
timestamps and its shards' warm generation time (Polars only). These figures time whatever else
shares the node; the perf scenarios (fleet/analysis/perf.py) measure speed on purpose.
"""

from __future__ import annotations

import polars as pl

from fleet.analysis.missing import no_nan
from fleet.analysis.parity import RUN, Frame


def throughput(requests: Frame, shards: Frame) -> pl.DataFrame:
    """Per (model, target): output_tok_s = sum(n_output_tokens) / sum(wall_s) over shards; latency quantiles.

    {ttft,tpot,e2e}_p{50,90,99}_s are linear-interpolated quantiles over the requests, nulls
    skipped (tpot is null for 1-token outputs, so a target with only those gets null tpot).

    Shards may run concurrently on different nodes, so output_tok_s is tokens per engine-second
    (one engine's throughput), not the fleet's aggregate rate.
    """
    latencies = [
        no_nan(pl.col(f"{metric}_s"), pl.col(f"{metric}_s").quantile(q / 100, interpolation="linear")).alias(
            f"{metric}_p{q}_s"
        )
        for metric in ("ttft", "tpot", "e2e")
        for q in (50, 90, 99)
    ]
    per_request = requests.lazy().group_by(RUN).agg(*latencies, n_requests=pl.len())
    per_shard = (
        shards.lazy()
        .group_by(RUN)
        .agg(output_tokens=pl.col("n_output_tokens").cast(pl.Int64).sum(), wall_s=pl.col("wall_s").sum())
        .with_columns(output_tok_s=pl.when(pl.col("wall_s") > 0).then(pl.col("output_tokens") / pl.col("wall_s")))
    )
    return (
        per_request.join(per_shard, on=RUN, how="full", coalesce=True)
        .select(
            *RUN, "n_requests", "output_tokens", "wall_s", "output_tok_s", *(q.meta.output_name() for q in latencies)
        )
        .sort(RUN)
        .collect()
    )
