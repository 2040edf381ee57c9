"""The perf scenarios' tables: one row per measured request, one per (scenario, level) run, one per
smoke check of a served target, the per-level summaries computed from them when read, and the
parity prompts' rows under load. Versioned with the parity tables (fleet/contracts/schema.py).
"""

from __future__ import annotations

import pyarrow as pa

from fleet.contracts.schema import KEYS, REQUESTS, TOKENS, table_schema

# Performance tables (issue 4): one row per measured request, one per (scenario, level) run, one
# per smoke check of a served target. Times are seconds; client-side ones on the load
# generator's time.perf_counter, engine-side ones from vLLM's RequestStateStats (engine clock).
_PERF_KEYS = [
    *(f for f in KEYS if f.name != "prompt_set"),
    pa.field("scenario", pa.string(), nullable=False, metadata={"doc": "perf scenario name"}),
    pa.field("level", pa.int32(), nullable=False, metadata={"doc": "concurrency: requests in flight at most"}),
]

# A sweep (Scenario.sweep) runs a level several times; the rows of each run carry its probe number.
_PROBE = pa.field(
    "probe",
    pa.int32(),
    metadata={"doc": "run within the level: 0 (or null) its only run or a sweep's closed loop, 1.. a sweep's probes"},
)

PERF_REQUESTS = table_schema(
    "perf_requests",
    [
        *_PERF_KEYS,
        pa.field("request_index", pa.int32(), nullable=False, metadata={"doc": "0-based, in scheduled order"}),
        pa.field("scheduled_s", pa.float64(), metadata={"doc": "due, from level start (closed loop: a slot freed)"}),
        pa.field("sent_s", pa.float64(), metadata={"doc": "when it was actually sent, from level start"}),
        pa.field("queue_delay_s", pa.float64(), metadata={"doc": "sent_s - scheduled_s: load generator behind"}),
        pa.field("ttft_s", pa.float64(), metadata={"doc": "send to first token (client)"}),
        pa.field("tpot_s", pa.float64(), metadata={"doc": "(last - first token) / (n - 1) (client); null if <2"}),
        pa.field("e2e_s", pa.float64(), metadata={"doc": "send to last token (client)"}),
        pa.field("itl_s", pa.list_(pa.float64()), metadata={"doc": "n-1 inter-token gaps; a k-token chunk: k x gap/k"}),
        pa.field("n_prompt_tokens", pa.int32(), metadata={"doc": "prompt tokens the engine saw (its own count)"}),
        pa.field("n_output_tokens", pa.int32(), metadata={"doc": "tokens received"}),
        pa.field("n_chunks", pa.int32(), metadata={"doc": "stream chunks that carried tokens"}),
        pa.field("engine_queue_s", pa.float64(), metadata={"doc": "engine: queued to scheduled"}),
        pa.field("engine_ttft_s", pa.float64(), metadata={"doc": "engine: scheduled to first token"}),
        pa.field("engine_tpot_s", pa.float64(), metadata={"doc": "engine: (last - first token) / (n - 1)"}),
        pa.field("error", pa.string(), metadata={"doc": "why the request failed; null if it completed"}),
        pa.field(
            "requested_prompt_tokens",
            pa.int32(),
            metadata={"doc": "prompt tokens the scenario asked for; null: a prompt set's or trace's text"},
        ),
        pa.field(
            "requested_output_tokens",
            pa.int32(),
            metadata={"doc": "output tokens asked for (ignore_eos); null: free output, max_tokens a cap"},
        ),
        _PROBE,
        pa.field("send_lag_s", pa.float64(), metadata={"doc": "sent - when it could go (due, and a slot free): "
            "the client behind its own schedule"}),
        pa.field("client", pa.int32(), metadata={"doc": "client process that sent it (0.. of the scenario's clients)"}),
    ],
)  # fmt: skip

PERF_LEVELS = table_schema(
    "perf_levels",
    [
        *_PERF_KEYS,
        pa.field("request_rate", pa.float64(), metadata={"doc": "Poisson arrivals per second; null: closed loop"}),
        pa.field("n_requests", pa.int32(), metadata={"doc": "measured requests (warm-up excluded)"}),
        pa.field("n_errors", pa.int32(), metadata={"doc": "of which failed"}),
        pa.field("started_at", pa.timestamp("us", tz="UTC"), metadata={"doc": "level start (wall clock)"}),
        pa.field("wall_s", pa.float64(), metadata={"doc": "level start to the last request done"}),
        pa.field("hostname", pa.string(), metadata={"doc": "node that ran the load generator"}),
        pa.field(
            "prefix_cache_queries",
            pa.int64(),
            metadata={"doc": "prompt tokens the engine looked up in its prefix cache; null: it reports none"},
        ),
        pa.field("prefix_cache_hits", pa.int64(), metadata={"doc": "of which found cached (measured requests only)"}),
        _PROBE,
        pa.field("clients", pa.int32(), metadata={"doc": "client processes that sent the load (null: 1)"}),
        pa.field("client_cpu_s", pa.float64(), metadata={"doc": "CPU seconds of the client's event-loop thread "
            "over the level (the busiest client's)"}),
    ],
)  # fmt: skip

SMOKE = table_schema(
    "smoke",
    [
        *(f for f in KEYS if f.name != "prompt_set"),
        pa.field("check", pa.string(), nullable=False, metadata={"doc": "API route exercised"}),
        pa.field(
            "passed",
            pa.bool_(),
            nullable=False,
            metadata={"doc": "HTTP 200 with at least one token back (models: the served model listed)"},
        ),
        pa.field("status", pa.int32(), metadata={"doc": "HTTP status; null if no response"}),
        pa.field("latency_s", pa.float64(), metadata={"doc": "request to full response"}),
        pa.field("response", pa.string(), metadata={"doc": "response body (truncated, secrets redacted)"}),
        pa.field("error", pa.string(), metadata={"doc": "why it failed; null if it passed"}),
    ],
)

# The per-level figures fleet/analysis/perf.py computes from the two tables above. Not stored:
# computed when read (`fleet query RUN "SELECT * FROM perf"`, the reports), so it always covers
# every stored level, resumed runs included.
PERF_SUMMARY = table_schema(
    "perf",
    [
        *_PERF_KEYS,
        pa.field("request_rate", pa.float64(), metadata={"doc": "Poisson arrivals per second; null: closed loop"}),
        pa.field("n_requests", pa.int64(), metadata={"doc": "measured requests"}),
        pa.field("n_completed", pa.int64(), metadata={"doc": "of which completed"}),
        pa.field("n_errors", pa.int64(), metadata={"doc": "of which failed"}),
        pa.field("wall_s", pa.float64(), metadata={"doc": "level wall time, seconds"}),
        pa.field("qps", pa.float64(), metadata={"doc": "completed requests / wall_s"}),
        pa.field("output_tok_s", pa.float64(), metadata={"doc": "output tokens / wall_s"}),
        pa.field("total_tok_s", pa.float64(), metadata={"doc": "(prompt + output tokens) / wall_s"}),
        pa.field("prefill_tok_s", pa.float64(), metadata={"doc": "prompt tokens / sum of TTFTs"}),
        pa.field("ttft_mean_s", pa.float64(), metadata={"doc": "TTFT mean, seconds"}),
        pa.field("ttft_p50_s", pa.float64(), metadata={"doc": "TTFT p50, seconds"}),
        pa.field("ttft_p90_s", pa.float64(), metadata={"doc": "TTFT p90, seconds"}),
        pa.field("ttft_p99_s", pa.float64(), metadata={"doc": "TTFT p99, seconds"}),
        pa.field("tpot_mean_s", pa.float64(), metadata={"doc": "TPOT mean, seconds"}),
        pa.field("tpot_p50_s", pa.float64(), metadata={"doc": "TPOT p50, seconds"}),
        pa.field("tpot_p90_s", pa.float64(), metadata={"doc": "TPOT p90, seconds"}),
        pa.field("tpot_p99_s", pa.float64(), metadata={"doc": "TPOT p99, seconds"}),
        pa.field("itl_mean_s", pa.float64(), metadata={"doc": "ITL mean, seconds"}),
        pa.field("itl_p50_s", pa.float64(), metadata={"doc": "ITL p50, seconds"}),
        pa.field("itl_p90_s", pa.float64(), metadata={"doc": "ITL p90, seconds"}),
        pa.field("itl_p99_s", pa.float64(), metadata={"doc": "ITL p99, seconds"}),
        pa.field("e2e_mean_s", pa.float64(), metadata={"doc": "E2E mean, seconds"}),
        pa.field("e2e_p50_s", pa.float64(), metadata={"doc": "E2E p50, seconds"}),
        pa.field("e2e_p90_s", pa.float64(), metadata={"doc": "E2E p90, seconds"}),
        pa.field("e2e_p99_s", pa.float64(), metadata={"doc": "E2E p99, seconds"}),
        pa.field("queue_delay_mean_s", pa.float64(), metadata={"doc": "mean send lag behind schedule, seconds"}),
        pa.field("queue_delay_max_s", pa.float64(), metadata={"doc": "largest send lag, seconds"}),
        pa.field("engine_queue_mean_s", pa.float64(), metadata={"doc": "engine: mean queued to scheduled, seconds"}),
        pa.field(
            "engine_ttft_mean_s", pa.float64(), metadata={"doc": "engine: mean scheduled to first token, seconds"}
        ),
        pa.field("engine_tpot_mean_s", pa.float64(), metadata={"doc": "engine: mean TPOT, seconds"}),
        pa.field("probe", pa.int32(), metadata={"doc": "run within the level: 0 its only run or a sweep's closed "
            "loop, 1.. a sweep's rate probes"}),
        pa.field("send_lag_p99_s", pa.float64(), metadata={"doc": "p99 of sent - when it could go, seconds"}),
        pa.field("client_cpu_share", pa.float64(), metadata={"doc": "client event-loop CPU s / wall_s (1: a core)"}),
        pa.field("client_bound", pa.bool_(), metadata={"doc": "the client, not the target, may have set the "
            "pace: send_lag_p99_s > 0.025 or client_cpu_share > 0.9"}),
    ],
)  # fmt: skip

# Requested against actual token counts and the prefix-cache hit rate per level
# (fleet/analysis/workload.py), computed when read like the perf summary.
PERF_LENGTHS = table_schema(
    "perf_lengths",
    [
        *_PERF_KEYS,
        pa.field("n_completed", pa.int64(), metadata={"doc": "completed requests"}),
        pa.field("requested_input_mean", pa.float64(), metadata={"doc": "mean prompt tokens asked for"}),
        pa.field("input_tokens_mean", pa.float64(), metadata={"doc": "mean prompt tokens the engine counted"}),
        pa.field("requested_output_mean", pa.float64(), metadata={"doc": "mean output tokens asked for (ignore_eos)"}),
        pa.field("output_tokens_mean", pa.float64(), metadata={"doc": "mean output tokens generated"}),
        pa.field("input_miss_max", pa.int64(), metadata={"doc": "largest |prompt tokens - requested| of a request"}),
        pa.field("output_miss_max", pa.int64(), metadata={"doc": "largest |output tokens - requested| of a request"}),
        pa.field("length_miss_max", pa.int64(), metadata={"doc": "the larger of the two; null: nothing asked"}),
        pa.field("lengths_exact", pa.bool_(), metadata={"doc": "length_miss_max <= 1 (else the report flags it)"}),
        pa.field("prefix_cache_queries", pa.int64(), metadata={"doc": "prompt tokens looked up in the prefix cache"}),
        pa.field("prefix_cache_hits", pa.int64(), metadata={"doc": "of which found cached"}),
        pa.field(
            "prefix_cache_hit_rate", pa.float64(), metadata={"doc": "hits / queries; null: the engine reports none"}
        ),
    ],
)

PERF_TABLES: dict[str, pa.Schema] = {
    "perf_requests": PERF_REQUESTS,
    "perf_levels": PERF_LEVELS,
    "smoke": SMOKE,
}


# Parity under load (a perf scenario's `parity:`, fleet/contracts/scenario.py): the parity prompts'
# requests and token rows at each level, sent alone before the load ("solo") and mid-load ("load"),
# keyed like the perf tables by scenario and level; their other columns are REQUESTS' and TOKENS'
# (the reference's teacher-forced columns included), so the parity analysis reads them as it reads
# a candidate's shards (fleet/analysis/load_parity.py).
LOAD_PHASES = ("solo", "load")  # each prompt alone on the engine before the load; all of them mid-load

_LOAD_KEYS = [REQUESTS.field(c) for c in ("run_id", "model", "model_weights", "target", "prompt_set")] + [
    pa.field("scenario", pa.string(), nullable=False, metadata={"doc": "perf scenario name"}),
    pa.field("level", pa.int32(), nullable=False, metadata={"doc": "concurrency: requests in flight at most"}),
    pa.field(
        "phase",
        pa.string(),
        nullable=False,
        metadata={"doc": "'solo': sent alone before the load (concurrency 1); 'load': sent mid-load"},
    ),
    pa.field("prompt_id", pa.string(), nullable=False, metadata={"doc": "prompt id within its set"}),
]
_LOAD_SKIP = {f.name for f in _LOAD_KEYS} | {"shard_id"}

LOAD_REQUESTS = table_schema(
    "load_requests",
    [
        *_LOAD_KEYS,
        pa.field(
            "in_flight_sent",
            pa.int32(),
            metadata={"doc": "the scenario's own requests in flight when this one was sent (solo: 0)"},
        ),
        pa.field(
            "in_flight_done",
            pa.int32(),
            metadata={"doc": "the scenario's own requests in flight when this one completed (solo: 0)"},
        ),
        *(f for f in REQUESTS if f.name not in _LOAD_SKIP),
    ],
)

LOAD_TOKENS = table_schema("load_tokens", [*_LOAD_KEYS, *(f for f in TOKENS if f.name not in _LOAD_SKIP)])

LOAD_TABLES: dict[str, pa.Schema] = {"load_requests": LOAD_REQUESTS, "load_tokens": LOAD_TOKENS}
