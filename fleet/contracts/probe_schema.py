"""The probe tables (full-vocabulary logprobs, hidden states after every layer) and the drill-down
table built from the layer probe. Versioned with the parity tables (fleet/contracts/schema.py).
"""

from __future__ import annotations

import pyarrow as pa

from fleet.contracts.schema import KEYS, table_schema

# Probe tables (issue 6), opt-in per manifest: full-vocabulary logprobs (the Qwen2.5 report's
# logits comparison) and hidden states after every layer (the Llama-3.2 report's layer-wise
# comparison). The float vectors are one list<float32> per row, never one row per element;
# analysis in fleet/analysis/probes.py and probe_metrics.py. Stored under these names: gates.METRICS
# points at "logits"/"layers".
_PROMPT_IDS = pa.field(
    "prompt_token_ids", pa.list_(pa.int32()), metadata={"doc": "the prompt as this engine tokenized it"}
)

PROBE_LOGITS = table_schema(
    "logits",
    [
        *KEYS,
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

PROBE_LAYERS = table_schema(
    "layers",
    [
        *KEYS,
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
DRILLDOWN = table_schema(
    "drilldown",
    [
        *KEYS,
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
