"""The result tables' Arrow schemas: defined once here, used by actors, store, analysis and docs.

Bump SCHEMA_VERSION when a column changes meaning, type or unit; it is written into every
Parquet file's metadata and into run.json so a reader can refuse what it does not understand.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 6
# Versions a reader still reads: 2 lacked run_id (the reader fills it in from run.json) and
# was laid out without `key=value` directory names; 2 and 3 lacked tokens.twin_logprob (null);
# 4 lacked prompt_stats.ref_top1_ids and ref_top1_in_topk (null: the report reads topk_ids there);
# 5 lacked prompt_stats' aggregates, tf_positions to split_ref_top1_in_topk (null: the report
# reads every position's lists there).
READABLE_VERSIONS = ("2", "3", "4", "5", "6")

# Every table starts with these keys; together with `position` they identify a token row.
_KEYS = [
    pa.field(
        "run_id",
        pa.string(),
        metadata={"doc": "the run the row belongs to (written by the store), so runs stack into one table"},
    ),
    pa.field("model", pa.string(), nullable=False, metadata={"doc": "model name from the manifest"}),
    pa.field(
        "model_weights",
        pa.string(),
        nullable=False,
        metadata={"doc": "sha256 (16 hex) of the weight files the target loaded"},
    ),
    pa.field("target", pa.string(), nullable=False, metadata={"doc": "target name from the manifest"}),
    pa.field("prompt_set", pa.string(), nullable=False, metadata={"doc": "prompt set name"}),
]
_TOPK = pa.list_(pa.int32())
_TOPK_LP = pa.list_(pa.float32())


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={"fleet.table": name, "fleet.schema_version": str(SCHEMA_VERSION)})


REQUESTS = _schema(
    "requests",
    [
        *_KEYS,
        pa.field("prompt_id", pa.string(), nullable=False, metadata={"doc": "prompt id within its set"}),
        pa.field("shard_id", pa.string(), nullable=False, metadata={"doc": "shard that produced the row"}),
        pa.field("prompt", pa.string(), metadata={"doc": "prompt text as sent (chat: as rendered by the template)"}),
        pa.field("messages", pa.string(), metadata={"doc": "chat messages as JSON; null for text prompts"}),
        pa.field("expected", pa.string(), metadata={"doc": 'expected-answer rule as JSON, e.g. {"number": 4}'}),
        pa.field("prompt_token_ids", pa.list_(pa.int32()), metadata={"doc": "prompt as the engine tokenized it"}),
        pa.field("output_text", pa.string(), metadata={"doc": "generated text"}),
        pa.field("output_token_ids", pa.list_(pa.int32()), metadata={"doc": "generated token ids"}),
        pa.field("n_prompt_tokens", pa.int32(), metadata={"doc": "tokens"}),
        pa.field("n_output_tokens", pa.int32(), metadata={"doc": "tokens"}),
        pa.field("finish_reason", pa.string(), metadata={"doc": "'length' or 'stop'"}),
        pa.field("queue_s", pa.float64(), metadata={"doc": "seconds from queued to scheduled (engine clock)"}),
        pa.field("ttft_s", pa.float64(), metadata={"doc": "seconds from scheduled to first token"}),
        pa.field("tpot_s", pa.float64(), metadata={"doc": "seconds per output token after the first; null if <2"}),
        pa.field("e2e_s", pa.float64(), metadata={"doc": "seconds from queued to last token"}),
    ],
)

TOKENS = _schema(
    "tokens",
    [
        *_KEYS,
        pa.field("prompt_id", pa.string(), nullable=False, metadata={"doc": "prompt id within its set"}),
        pa.field("position", pa.int32(), nullable=False, metadata={"doc": "0-based index in the output"}),
        pa.field("token_id", pa.int32(), nullable=False, metadata={"doc": "generated token"}),
        pa.field("logprob", pa.float32(), metadata={"doc": "this target's log-probability of token_id (nats)"}),
        pa.field("rank", pa.int32(), metadata={"doc": "1-based rank of token_id in this target's distribution"}),
        pa.field("topk_ids", _TOPK, metadata={"doc": "this target's top-k token ids, best first"}),
        pa.field("topk_logprobs", _TOPK_LP, metadata={"doc": "their log-probabilities (nats)"}),
        pa.field("ref_logprob", pa.float32(), metadata={"doc": "reference's teacher-forced logprob of token_id"}),
        pa.field("ref_rank", pa.int32(), metadata={"doc": "1-based rank of token_id under the reference"}),
        pa.field("ref_topk_ids", _TOPK, metadata={"doc": "reference's top-k ids at this position"}),
        pa.field("ref_topk_logprobs", _TOPK_LP, metadata={"doc": "their log-probabilities (nats)"}),
        pa.field(
            "twin_logprob",
            pa.float32(),
            metadata={
                "doc": "the reference's model cast to this target's dtype, other attention kernel: a correct "
                "implementation at this precision, teacher-forced on token_id (null: no twin ran)"
            },
        ),
    ],
)

SHARDS = _schema(
    "shards",
    [
        *_KEYS,
        pa.field("shard_id", pa.string(), nullable=False, metadata={"doc": "model/target/prompt_set/chunk"}),
        pa.field("n_requests", pa.int32(), metadata={"doc": "prompts in the shard"}),
        pa.field("n_output_tokens", pa.int32(), metadata={"doc": "tokens generated in the shard"}),
        pa.field("started_at", pa.timestamp("us", tz="UTC"), metadata={"doc": "when generation began"}),
        pa.field("wall_s", pa.float64(), metadata={"doc": "seconds of generation, warm engine"}),
        pa.field("hostname", pa.string(), metadata={"doc": "node that ran it"}),
    ],
)

# One row per prompt of a shard, written beside its token rows (fleet/results/prompt_stats.py): the
# token columns the report's per-prompt comparisons read, as lists indexed by position, and the sums
# its per-candidate figures merge. The report reads these instead of joining token rows.
_LP_LIST = pa.list_(pa.float32())
PROMPT_STATS = _schema(
    "prompt_stats",
    [
        *_KEYS,
        pa.field("prompt_id", pa.string(), nullable=False, metadata={"doc": "prompt id within its set"}),
        pa.field("n_positions", pa.int32(), metadata={"doc": "token rows of the prompt"}),
        pa.field(
            "contiguous",
            pa.bool_(),
            metadata={"doc": "positions are 0..n_positions-1, so a list's index is the position (else unused)"},
        ),
        pa.field("first_token_id", pa.int32(), metadata={"doc": "token at position 0; null if no such row"}),
        pa.field(
            "first_top1_tied", pa.bool_(), metadata={"doc": "tie-aware top-1 agreement at position 0 (null: unscored)"}
        ),
        pa.field("logprobs", _LP_LIST, metadata={"doc": "tokens.logprob by position"}),
        pa.field("ref_logprobs", _LP_LIST, metadata={"doc": "tokens.ref_logprob by position"}),
        pa.field("twin_logprobs", _LP_LIST, metadata={"doc": "tokens.twin_logprob by position"}),
        pa.field("ref_top1_logprobs", _LP_LIST, metadata={"doc": "first of tokens.ref_topk_logprobs by position"}),
        pa.field("in_ref_topk", pa.list_(pa.bool_()), metadata={"doc": "token_id is in ref_topk_ids, by position"}),
        pa.field("topk_ids", pa.list_(_TOPK), metadata={"doc": "tokens.topk_ids by position"}),
        pa.field("ref_top1_ids", _TOPK, metadata={"doc": "first of tokens.ref_topk_ids by position"}),
        pa.field(
            "ref_top1_in_topk",
            pa.list_(pa.bool_()),
            metadata={"doc": "the first of ref_topk_ids is in topk_ids, by position (read instead of topk_ids)"},
        ),
        pa.field("top1_scored", pa.int32(), metadata={"doc": "positions the reference scored"}),
        pa.field("top1_agreed", pa.int32(), metadata={"doc": "of which tie-aware top-1 agrees"}),
        pa.field("kl_positions", pa.int32(), metadata={"doc": "positions with both top-k lists (KL top-k)"}),
        pa.field("kl_sum", pa.float64(), metadata={"doc": "sum of their KL top-k (nats)"}),
        pa.field("kl_nan", pa.bool_(), metadata={"doc": "a KL top-k is NaN"}),
        # |dlogp| aggregates (fleet/results/prompt_tails.py): the report's p99s, means and bootstrap
        pa.field("tf_positions", pa.int32(), metadata={"doc": "positions with logprob and ref_logprob"}),
        pa.field("twin_positions", pa.int32(), metadata={"doc": "of which the twin scored (twin_logprob a number)"}),
        pa.field("tf_abs_sum", pa.float64(), metadata={"doc": "sum of |logprob - ref_logprob| there (NaN: a NaN)"}),
        pa.field("tf_abs_max", pa.float64(), metadata={"doc": "largest |logprob - ref_logprob| there"}),
        pa.field(
            "tf_tail_floor",
            pa.float64(),
            metadata={"doc": "the shard's floor: the |dlogp| its top tenth of positions reach (0: all kept)"},
        ),
        pa.field(
            "tf_abs_tail",
            pa.list_(pa.float64()),
            metadata={"doc": "every |logprob - ref_logprob| at or above tf_tail_floor, by position"},
        ),
        pa.field("twin_tail_floor", pa.float64(), metadata={"doc": "tf_tail_floor of |twin - reference|"}),
        pa.field(
            "twin_abs_tail",
            pa.list_(pa.float64()),
            metadata={"doc": "every |twin_logprob - ref_logprob| at or above twin_tail_floor, by position"},
        ),
        pa.field("first_ref_logprob", pa.float32(), metadata={"doc": "tokens.ref_logprob at position 0"}),
        # The values at the first divergence, where it is the split (fleet/analysis/stats_divergences.py)
        pa.field(
            "top1_split",
            pa.int32(),
            metadata={"doc": "first position whose token is not the first of ref_topk_ids (null: none)"},
        ),
        pa.field("split_ref_logprob", pa.float32(), metadata={"doc": "tokens.ref_logprob at top1_split"}),
        pa.field("split_ref_top1_logprob", pa.float32(), metadata={"doc": "ref_top1_logprobs at top1_split"}),
        pa.field("split_in_ref_topk", pa.bool_(), metadata={"doc": "in_ref_topk at top1_split"}),
        pa.field("split_ref_top1_id", pa.int32(), metadata={"doc": "ref_top1_ids at top1_split"}),
        pa.field("split_ref_top1_in_topk", pa.bool_(), metadata={"doc": "ref_top1_in_topk at top1_split"}),
    ],
)

# Columns the reference fills in by teacher-forced scoring of a candidate's tokens.
SCORE_COLUMNS = ["ref_logprob", "ref_rank", "ref_topk_ids", "ref_topk_logprobs", "twin_logprob"]
# What score() returns: the join keys plus SCORE_COLUMNS.
SCORES = _schema(
    "scores",
    [TOKENS.field("prompt_id"), TOKENS.field("position"), *(TOKENS.field(c) for c in SCORE_COLUMNS)],
)

TABLES: dict[str, pa.Schema] = {
    "requests": REQUESTS,
    "tokens": TOKENS,
    "prompt_stats": PROMPT_STATS,
    "shards": SHARDS,
}


def all_tables() -> dict[str, pa.Schema]:
    """Every table a run directory may hold: parity (TABLES), perf, parity under load, probe and drill-down tables."""
    return (
        TABLES
        | PERF_TABLES
        | globals().get("LOAD_TABLES", {})
        | globals().get("PROBE_TABLES", {})
        | globals().get("DRILLDOWN_TABLES", {})
    )


# The pages `make docs` keeps in sync with the code: the tables' columns (between <!-- schema:NAME -->
# and <!-- /schema -->) and the names a user types (between <!-- names:KEY --> and <!-- /names -->;
# an error for a wrong gate metric id points there, fleet/contracts/gates.py). Paths are from the
# repository's top; tests/test_store.py and tests/test_messages.py fail when a page is stale.
TABLES_PAGE = "docs/results.md"
NAMES_PAGE = "docs/metrics.md"


def documented_tables() -> dict[str, pa.Schema]:
    """Every table the docs document: the stored ones and the perf summary computed from them."""
    return all_tables() | {"perf": PERF_SUMMARY, "perf_lengths": PERF_LENGTHS}


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Order and cast `table`'s columns to `schema`, adding absent nullable columns as nulls."""
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table.column(field.name).cast(field.type))
        elif field.nullable:
            columns.append(pa.nulls(table.num_rows, field.type))
        else:
            msg = f"table {schema.metadata[b'fleet.table'].decode()!r} lacks required column {field.name!r}"
            raise ValueError(msg)
    return pa.Table.from_arrays(columns, schema=schema)


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list<{_type_name(t.value_type)}>"
    return {"float": "float32", "double": "float64"}.get(str(t), str(t))


def markdown(schema: pa.Schema) -> str:
    """The schema as a Markdown table, for TABLES_PAGE (kept in sync by a test)."""
    rows = ["| column | type | meaning |", "|---|---|---|"]
    for field in schema:
        doc = (field.metadata or {}).get(b"doc", b"").decode()
        rows.append(f"| `{field.name}` | {_type_name(field.type)} | {doc} |")
    return "\n".join(rows)


def documented_names() -> dict[str, str]:
    """Names a user types that NAMES_PAGE lists whole (between <!-- names:KEY --> markers): an
    error for a wrong one points there when the list is too long for the message."""
    from fleet.contracts.gates import METRICS

    return {"gate-metrics": ", ".join(f"`{name}`" for name in METRICS)}


def sync_docs(root: str = ".") -> None:
    """Rewrite the schema tables in TABLES_PAGE and the name lists in NAMES_PAGE (under `root`)
    from the code. A page that lacks a table's or a list's markers is an error, so that nothing
    documented is dropped silently."""
    from pathlib import Path

    tables = Path(root) / TABLES_PAGE
    text = tables.read_text(encoding="utf-8")
    for name, declared in documented_tables().items():
        text = _between(text, f"<!-- schema:{name} -->", "<!-- /schema -->", markdown(declared), page=tables)
    tables.write_text(text, encoding="utf-8")
    names_page = Path(root) / NAMES_PAGE
    text = names_page.read_text(encoding="utf-8")
    for key, names in documented_names().items():
        text = _between(text, f"<!-- names:{key} -->", "<!-- /names -->", names, page=names_page)
    names_page.write_text(text, encoding="utf-8")


def _between(text: str, start: str, end: str, body: str, *, page: object) -> str:
    """`text` with what lies between the marker lines `start` and `end` replaced by `body` (as is:
    a function replacement, so a backslash in it is not a group reference); `page` names the
    file in the error when the markers are missing."""
    import re

    block = re.compile(rf"({re.escape(start)}\n).*?({re.escape(end)})", re.S)
    text, found = block.subn(lambda m: f"{m.group(1)}{body}\n{m.group(2)}", text)
    if not found:
        msg = f"{page}: no {start} ... {end} markers to write into"
        raise ValueError(msg)
    return text


# Performance tables (issue 4): one row per measured request, one per (scenario, level) run, one
# per smoke check of a served target. Times are seconds; client-side ones on the load
# generator's time.perf_counter, engine-side ones from vLLM's RequestStateStats (engine clock).
_PERF_KEYS = [
    *(f for f in _KEYS if f.name != "prompt_set"),
    pa.field("scenario", pa.string(), nullable=False, metadata={"doc": "perf scenario name"}),
    pa.field("level", pa.int32(), nullable=False, metadata={"doc": "concurrency: requests in flight at most"}),
]

# A sweep (Scenario.sweep) runs a level several times; the rows of each run carry its probe number.
_PROBE = pa.field(
    "probe",
    pa.int32(),
    metadata={"doc": "run within the level: 0 (or null) its only run or a sweep's closed loop, 1.. a sweep's probes"},
)

PERF_REQUESTS = _schema(
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

PERF_LEVELS = _schema(
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

SMOKE = _schema(
    "smoke",
    [
        *(f for f in _KEYS if f.name != "prompt_set"),
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
PERF_SUMMARY = _schema(
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
PERF_LENGTHS = _schema(
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

LOAD_REQUESTS = _schema(
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

LOAD_TOKENS = _schema("load_tokens", [*_LOAD_KEYS, *(f for f in TOKENS if f.name not in _LOAD_SKIP)])

LOAD_TABLES: dict[str, pa.Schema] = {"load_requests": LOAD_REQUESTS, "load_tokens": LOAD_TOKENS}


# Probe tables (issue 6), opt-in per manifest: full-vocabulary logprobs (the Qwen2.5 report's
# logits comparison) and hidden states after every layer (the Llama-3.2 report's layer-wise
# comparison). The float vectors are one list<float32> per row, never one row per element;
# analysis in fleet/probes.py. Stored under these names: gates.METRICS points at "logits"/"layers".
_PROMPT_IDS = pa.field(
    "prompt_token_ids", pa.list_(pa.int32()), metadata={"doc": "the prompt as this engine tokenized it"}
)

PROBE_LOGITS = _schema(
    "logits",
    [
        *_KEYS,
        pa.field("prompt_id", pa.string(), nullable=False, metadata={"doc": "prompt id within its set"}),
        pa.field(
            "position",
            pa.int32(),
            nullable=False,
            metadata={"doc": "0-based prompt position whose next-token distribution this is (last: n - 1)"},
        ),
        pa.field("n_prompt_tokens", pa.int32(), metadata={"doc": "tokens in the prompt"}),
        _PROMPT_IDS,
        pa.field(
            "logprobs",
            pa.list_(pa.float32()),
            metadata={"doc": "log-softmax over the full vocabulary (nats), computed in float32; index = token id"},
        ),
    ],
)

PROBE_LAYERS = _schema(
    "layers",
    [
        *_KEYS,
        pa.field("prompt_id", pa.string(), nullable=False, metadata={"doc": "prompt id within its set"}),
        pa.field(
            "layer",
            pa.int32(),
            nullable=False,
            metadata={"doc": "0 = embeddings, i = output of decoder layer i (1-based), L + 1 = after the final norm"},
        ),
        pa.field(
            "kind",
            pa.string(),
            metadata={
                "doc": "'embed', 'decoder' or 'norm'; drill-down: also 'attention' and 'mlp', layer i's sub-layers"
            },
        ),
        pa.field("n_positions", pa.int32(), metadata={"doc": "prompt positions stored (rows of `hidden`)"}),
        pa.field("hidden_size", pa.int32(), metadata={"doc": "model width (columns of `hidden`)"}),
        pa.field("positions", pa.list_(pa.int32()), metadata={"doc": "which prompt positions, in row order"}),
        _PROMPT_IDS,
        pa.field(
            "hidden",
            pa.list_(pa.float32()),
            metadata={"doc": "hidden states [n_positions x hidden_size], row-major, as float32 (bf16 exactly)"},
        ),
    ],
)

PROBE_TABLES: dict[str, pa.Schema] = {"logits": PROBE_LOGITS, "layers": PROBE_LAYERS}

# The drill-down (`drilldown: true`): the layer probe's rows at each real divergence's prefix, with
# the divergence they reproduce; analysis in fleet/analysis/drilldown.py.
DRILLDOWN = _schema(
    "drilldown",
    [
        *_KEYS,
        pa.field("prompt_id", pa.string(), nullable=False, metadata={"doc": "prompt id within its set"}),
        pa.field(
            "diverging", pa.string(), nullable=False, metadata={"doc": "the candidate whose divergence this reproduces"}
        ),
        pa.field(
            "step",
            pa.int32(),
            nullable=False,
            metadata={"doc": "its first divergent output position: the prefix is the prompt + `step` shared tokens"},
        ),
        pa.field(
            "twin_dtype",
            pa.string(),
            metadata={"doc": "the precision twin's dtype when these are the twin's states (target: the reference)"},
        ),
        *(
            f
            for f in PROBE_LAYERS
            if f.name not in {"run_id", "model", "model_weights", "target", "prompt_set", "prompt_id"}
        ),
    ],
)
DRILLDOWN_TABLES: dict[str, pa.Schema] = {"drilldown": DRILLDOWN}


if __name__ == "__main__":
    sync_docs()
