"""Requested against actual token counts and the prefix-cache hit rate, from stored rows, against
hand-computed figures; the counters as vLLM's /metrics text gives them (no engine)."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from actors.cache_stats import from_prometheus
from fleet.analysis.workload import length_flags, lengths
from fleet.contracts import perf_schema

KEYS = {"model": "m", "model_weights": "w", "target": "t", "scenario": "s"}

# As vLLM 0.32's server prints them (prometheus_client: counters end in _total), two engines.
METRICS = """\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 300.0
vllm:prefix_cache_queries_total{engine="0",model_name="other"} 5.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 640.0
vllm:prefix_cache_hits_total{engine="1",model_name="tiny"} 128.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="tiny"} 9.0
"""


def test_prometheus_counters_sum_over_engines_of_one_model() -> None:
    assert from_prometheus(METRICS, model="tiny") == (1500, 768)
    assert from_prometheus(METRICS) == (1505, 768)
    assert from_prometheus("# no vllm here\nprocess_cpu_seconds_total 3.0\n") is None


def request(level: int, asked_in: int | None, seen_in: int, asked_out: int | None, got_out: int, **kw: Any) -> dict:
    counts = {"n_prompt_tokens": seen_in, "n_output_tokens": got_out}
    asked = {"requested_prompt_tokens": asked_in, "requested_output_tokens": asked_out}
    return KEYS | {"level": level, "request_index": 0} | counts | asked | kw


def tables(rows: list[dict[str, Any]], cache: dict[int, tuple[int, int] | None]) -> tuple[Any, Any]:
    levels = [
        KEYS | {"level": lv, "n_requests": 1}
        | ({"prefix_cache_queries": c[0], "prefix_cache_hits": c[1]} if c else {})
        for lv, c in cache.items()
    ]  # fmt: skip
    return (
        pl.from_arrow(pa.Table.from_pylist(rows, schema=perf_schema.PERF_REQUESTS)),
        pl.from_arrow(pa.Table.from_pylist(levels, schema=perf_schema.PERF_LEVELS)),
    )


def test_lengths_per_level_and_the_flag_for_a_miss_over_one_token() -> None:
    rows = [
        request(1, 100, 100, 16, 16),
        request(1, 60, 61, 16, 16),  # a 1-token miss is within the allowance
        request(1, 80, 80, 16, 16, error="boom"),  # failed: counts nowhere
        request(2, 100, 97, 16, 16),  # 3 tokens short: flagged
        request(2, 50, 50, None, 7),  # free output: asks for no output count
        request(4, None, 33, None, 5),  # a prompt set's prompt: nothing asked
    ]
    out = lengths(*tables(rows, {1: (1000, 250), 2: (400, 0), 4: None}))
    by = {r["level"]: r for r in out.iter_rows(named=True)}
    assert (by[1]["requested_input_mean"], by[1]["input_tokens_mean"]) == (80.0, 80.5)
    assert (by[1]["requested_output_mean"], by[1]["output_tokens_mean"]) == (16.0, 16.0)
    assert (by[1]["length_miss_max"], by[1]["lengths_exact"], by[1]["prefix_cache_hit_rate"]) == (1, True, 0.25)
    assert (by[2]["input_miss_max"], by[2]["output_miss_max"], by[2]["lengths_exact"]) == (3, 0, False)
    assert by[2]["requested_output_mean"] == 16.0 and by[2]["prefix_cache_hit_rate"] == 0.0  # an honest 0
    assert by[4]["length_miss_max"] is None and by[4]["lengths_exact"] is None
    assert by[4]["prefix_cache_hit_rate"] is None  # not reported, not 0
    [flag] = length_flags(out)
    assert flag.startswith("LENGTH MISS: t s at concurrency 2: a request missed its requested token count by 3")
    assert out.schema == pl.DataFrame(perf_schema.PERF_LENGTHS.empty_table()).drop("run_id").schema
