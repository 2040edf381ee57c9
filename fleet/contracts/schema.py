"""The result tables' Arrow schemas: the schema version, the key columns every table starts with,
and the parity tables (requests, tokens, shards, prompt_stats, scores); used by actors, store,
analysis and docs. Beside it in fleet/contracts/: perf_schema.py (the perf and load tables),
probe_schema.py (the probe and drill-down tables), stored_tables.py (every stored table by name)
and schema_docs.py (the docs generated from them).

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
KEYS = [
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


def table_schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    """A table's schema, its metadata naming the table and SCHEMA_VERSION (so every Parquet file carries both)."""
    return pa.schema(fields, metadata={"fleet.table": name, "fleet.schema_version": str(SCHEMA_VERSION)})


REQUESTS = table_schema(
    "requests",
    [
        *KEYS,
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

TOKENS = table_schema(
    "tokens",
    [
        *KEYS,
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

SHARDS = table_schema(
    "shards",
    [
        *KEYS,
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
PROMPT_STATS = table_schema(
    "prompt_stats",
    [
        *KEYS,
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
SCORES = table_schema(
    "scores",
    [TOKENS.field("prompt_id"), TOKENS.field("position"), *(TOKENS.field(c) for c in SCORE_COLUMNS)],
)

TABLES: dict[str, pa.Schema] = {
    "requests": REQUESTS,
    "tokens": TOKENS,
    "prompt_stats": PROMPT_STATS,
    "shards": SHARDS,
}


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
