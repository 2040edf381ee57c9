"""Engine-side helpers for the deep parity probes (issue 6): full-vocabulary logprobs and hidden states.

The engines compute, this module packs: each probe returns one Arrow table of the schemas in
fleet.contracts.probe_schema.PROBE_TABLES, with the long float vectors as `list<float32>` columns built straight
from numpy (no Python float per element: a Qwen2.5 vocabulary is 151,936 entries per row).
Imports numpy and pyarrow only; torch and vLLM stay in the engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet.contracts.engine import ResolvedModel


@dataclass(frozen=True)
class LogitsRows:
    """One prompt's full-vocabulary logprobs: row i is the distribution after prompt token first + i."""

    prompt_id: str
    prompt_token_ids: list[int]
    first: int  # prompt position of row 0: n - 1 for "last", 0 for "all"
    logprobs: np.ndarray  # [rows, vocab], float32


@dataclass(frozen=True)
class LayerRows:
    """One prompt's hidden states: `hidden[j]` is [positions, hidden_size] for layer `layers[j]`."""

    prompt_id: str
    prompt_token_ids: list[int]
    positions: list[int]
    layers: list[tuple[int, str]]  # (layer index, kind: embed | decoder | norm)
    hidden: list[np.ndarray]


def keys(model: ResolvedModel, target: str, prompt_set: str) -> dict[str, str]:
    """The key columns every probe row starts with (fleet.contracts.schema.KEYS)."""
    return {"model": model.name, "model_weights": model.weights, "target": target, "prompt_set": prompt_set}


def float_lists(arrays: list[np.ndarray]) -> pa.Array:
    """A list<float32> column, one list per array (flattened), without going through Python floats."""
    import pyarrow as pa

    flat = [np.ascontiguousarray(a, dtype=np.float32).ravel() for a in arrays]
    offsets = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum([len(f) for f in flat], out=offsets[1:])
    if offsets[-1] >= 2**31:  # list<> offsets are int32; a table this size is a shard too big anyway
        msg = f"{offsets[-1]} floats in one probe table: use fewer prompts per shard or positions='last'"
        raise ValueError(msg)
    values = np.concatenate(flat) if flat else np.zeros(0, np.float32)
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), pa.array(values, type=pa.float32()))


def logits_table(key: dict[str, str], prompts: list[LogitsRows]) -> pa.Table:
    """PROBE_LOGITS rows: one per (prompt, position)."""
    from fleet.contracts import probe_schema

    rows = [
        {
            "prompt_id": p.prompt_id,
            "position": p.first + i,
            "n_prompt_tokens": len(p.prompt_token_ids),
            "prompt_token_ids": p.prompt_token_ids,
        }
        for p in prompts
        for i in range(len(p.logprobs))
    ]
    vectors = [row for p in prompts for row in p.logprobs]
    return _table(key, rows, "logprobs", vectors, probe_schema.PROBE_LOGITS)


def layers_table(key: dict[str, str], prompts: list[LayerRows]) -> pa.Table:
    """PROBE_LAYERS rows: one per (prompt, layer), hidden states flattened [positions x hidden_size]."""
    from fleet.contracts import probe_schema

    rows = [
        {
            "prompt_id": p.prompt_id,
            "layer": layer,
            "kind": kind,
            "n_positions": h.shape[0],
            "hidden_size": h.shape[1],
            "positions": p.positions,
            "prompt_token_ids": p.prompt_token_ids,
        }
        for p in prompts
        for (layer, kind), h in zip(p.layers, p.hidden, strict=True)
    ]
    vectors = [h for p in prompts for h in p.hidden]
    return _table(key, rows, "hidden", vectors, probe_schema.PROBE_LAYERS)


def _table(
    key: dict[str, str], rows: list[dict[str, Any]], column: str, vectors: list[np.ndarray], declared: pa.Schema
) -> pa.Table:
    import pyarrow as pa

    from fleet.contracts import schema

    if not rows:
        return declared.empty_table()
    table = pa.Table.from_pylist([key | r for r in rows]).append_column(column, float_lists(vectors))
    return schema.conform(table, declared)


def dense_logprobs(flat: Any, index: int, vocab_size: int) -> np.ndarray:
    """Position `index` of a vLLM FlatLogprobs holding the full vocabulary, as a dense [vocab] array.

    With logprobs / prompt_logprobs = -1 each position holds vocab_size + 1 entries: first the
    sampled (or prompt) token, then every token by rank. The ranked ones are scattered by id.
    """
    start, end = flat.start_indices[index] + 1, flat.end_indices[index]
    ids = np.asarray(flat.token_ids[start:end], dtype=np.int64)
    values = np.asarray(flat.logprobs[start:end], dtype=np.float32)
    if len(ids) != vocab_size or len(np.unique(ids)) != vocab_size:
        msg = f"expected logprobs for all {vocab_size} tokens at position {index}, got {len(ids)} entries"
        raise ValueError(msg)
    out = np.empty(vocab_size, dtype=np.float32)
    out[ids] = values
    return out
