"""What each perf level sent against what it asked for, and how much of it the prefix cache served,
from the perf_requests and perf_levels tables alone (Polars only).

* requested_input_mean / input_tokens_mean: the prompt tokens asked for (the scenario's count or
  distribution, after the chat template with send: chat) and the prompt tokens the engine itself
  counted (a server's usage.prompt_tokens, an offline engine's prompt ids), over completed requests
  that asked for a count; requested_output_mean / output_tokens_mean likewise, over requests whose
  output length was exact (ignore_eos; free output asks for no count);
* input_miss_max / output_miss_max: the largest |actual - requested| of one request; length_miss_max
  the larger of the two, and lengths_exact whether it is at most 1 token (actors/exact_text.py builds
  prompts to miss by 0; the 1-token slack is the issue's, for a server whose template differs by a
  BOS). Null where nothing asked for a count (a prompt set; a trace of texts);
* prefix_cache_hit_rate = prefix_cache_hits / prefix_cache_queries over the level's measured
  requests (warm-up excluded), the engine's own counters (vLLM's vllm:prefix_cache_hits and
  vllm:prefix_cache_queries, in tokens: actors/cache_stats.py); null where the engine reports none.
"""

from __future__ import annotations

import polars as pl

from fleet.analysis.perf import KEYS

Frame = pl.DataFrame | pl.LazyFrame
MISS_ALLOWED = 1  # tokens a request may miss its requested length by before the level is flagged


def lengths(requests: Frame, levels: Frame) -> pl.DataFrame:
    """One row per (model, target, scenario, level): requested and actual token counts, the largest
    miss and whether it is within MISS_ALLOWED, and the prefix-cache hit rate."""
    done = requests.lazy().filter(pl.col("error").is_null())
    asked_in, asked_out = pl.col("requested_prompt_tokens"), pl.col("requested_output_tokens")
    miss_in = (pl.col("n_prompt_tokens").cast(pl.Int64) - asked_in.cast(pl.Int64)).abs()
    miss_out = (pl.col("n_output_tokens").cast(pl.Int64) - asked_out.cast(pl.Int64)).abs()
    counts = done.group_by(KEYS).agg(
        n_completed=pl.len().cast(pl.Int64),
        requested_input_mean=asked_in.mean(),
        input_tokens_mean=pl.col("n_prompt_tokens").filter(asked_in.is_not_null()).mean(),
        input_miss_max=miss_in.max(),
        requested_output_mean=asked_out.mean(),
        output_tokens_mean=pl.col("n_output_tokens").filter(asked_out.is_not_null()).mean(),
        output_miss_max=miss_out.max(),
    )
    cache = levels.lazy().select(*KEYS, "prefix_cache_queries", "prefix_cache_hits")
    out = (
        cache.join(counts, on=KEYS, how="left")
        .with_columns(
            n_completed=pl.col("n_completed").fill_null(0),
            length_miss_max=pl.max_horizontal("input_miss_max", "output_miss_max"),
            prefix_cache_hit_rate=pl.when(pl.col("prefix_cache_queries") > 0).then(
                pl.col("prefix_cache_hits") / pl.col("prefix_cache_queries")
            ),
        )
        .with_columns(lengths_exact=pl.col("length_miss_max") <= MISS_ALLOWED)
    )
    columns = [
        *KEYS, "n_completed", "requested_input_mean", "input_tokens_mean", "requested_output_mean",
        "output_tokens_mean", "input_miss_max", "output_miss_max", "length_miss_max", "lengths_exact",
        "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate",
    ]  # fmt: skip
    return out.select(columns).sort(KEYS).collect()


def length_flags(table: pl.DataFrame) -> list[str]:
    """One line per level whose lengths missed by more than MISS_ALLOWED tokens: the visible flag."""
    missed = table.filter(pl.col("lengths_exact").not_())
    return [
        f"LENGTH MISS: {r['target']} {r['scenario']} at concurrency {r['level']}: a request missed its requested "
        f"token count by {r['length_miss_max']} tokens (mean input {_n(r['requested_input_mean'])} asked, "
        f"{_n(r['input_tokens_mean'])} seen; mean output {_n(r['requested_output_mean'])} asked, "
        f"{_n(r['output_tokens_mean'])} generated)"
        for r in missed.iter_rows(named=True)
    ]


def _n(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"
