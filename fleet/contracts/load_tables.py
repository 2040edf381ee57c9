"""The tables of parity under load (a perf scenario's `parity:`, fleet/contracts/spec.py): the
parity prompts' requests and token rows at each level, sent mid-load ("load") and alone before
the load ("solo"), keyed like the perf tables by scenario and level. Their other columns are the
parity tables' (schema.REQUESTS, schema.TOKENS, the reference's teacher-forced columns included),
so the parity analysis reads them as it reads a candidate's shards (fleet/analysis/load_parity.py)."""

from __future__ import annotations

import pyarrow as pa

from fleet.contracts import schema

PHASES = ("solo", "load")  # each prompt alone on the engine before the load; all of them mid-load

_LOAD_KEYS = [schema.REQUESTS.field(c) for c in ("run_id", "model", "model_weights", "target", "prompt_set")] + [
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
_SKIP = {f.name for f in _LOAD_KEYS} | {"shard_id"}

LOAD_REQUESTS = schema.table_schema(
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
        *(f for f in schema.REQUESTS if f.name not in _SKIP),
    ],
)

LOAD_TOKENS = schema.table_schema("load_tokens", [*_LOAD_KEYS, *(f for f in schema.TOKENS if f.name not in _SKIP)])

LOAD_TABLES: dict[str, pa.Schema] = {"load_requests": LOAD_REQUESTS, "load_tokens": LOAD_TOKENS}
