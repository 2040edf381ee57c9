"""What a report says about how a run ran, from run.json and the models' files rather than from its
tables' figures: the notices a reader must see before trusting the figures, the environment (each
model/target's provenance) and each model's architecture (its config.json and parameter count).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl

from fleet.results.info import RunInfo

# fmt: off
ARCH_KEYS = [
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "vocab_size", "rope_theta", "hidden_act",
    "rms_norm_eps", "tie_word_embeddings", "dtype", "torch_dtype",
]
# fmt: on


def notices(info: RunInfo, requests: pl.DataFrame) -> list[str]:
    """Lines a reader must see before trusting the figures: failures, retries, test doubles, mixed weights."""
    out = [f"FAILED {key}: {reason}" for key, reason in info.failures.items()]
    out += [f"FAILED shard {shard}: {reason}" for shard, reason in info.failed_shards.items()]
    if info.retries:
        out.append(f"retried calls: {info.retries} (faults survived; rows are written once per shard)")
    doubles = [k for k, p in info.provenance.items() if (p or {}).get("device") == "test-double"]
    if doubles:
        out.append(f"TEST DOUBLE targets (no model ran; figures are meaningless): {', '.join(doubles)}")
    # Each file holds one model's rows under one weight digest: the runs of equal neighbours are
    # few, and grouping them gives what grouping every request gives, without hashing millions.
    pair = requests.select("model", "model_weights")
    changed = pl.any_horizontal(pl.col(c).ne_missing(pl.col(c).shift()).fill_null(True) for c in pair.columns)
    runs = pair.filter(changed | (pl.int_range(pl.len()) == 0))
    weights = runs.group_by("model", maintain_order=True).agg(pl.col("model_weights").unique())
    for model, digests in weights.iter_rows():
        if len(digests) > 1:  # every target of a model must have loaded the same bytes
            out.append(f"WARNING {model}: targets loaded different weights {sorted(digests)}")
    return out


def environment(info: RunInfo) -> pl.DataFrame:
    """One row per provenance key (versions, device, host, weights sha), one column per model/target."""
    prov = info.provenance
    keys = list(dict.fromkeys(k for p in prov.values() for k in p if k != "model_dir"))
    data = {"component": keys} | {name: [str(p.get(k, "—")) for k in keys] for name, p in prov.items()}
    return pl.DataFrame(data, schema=dict.fromkeys(data, pl.String))


def architecture(info: RunInfo, model: str) -> dict[str, Any]:
    """Selected config.json fields of `model` (model_dir from run.json provenance), plus its parameter count."""
    for key, prov in info.provenance.items():
        model_dir = Path(prov.get("model_dir") or "/nonexistent")
        if key.split("/")[0] == model and (model_dir / "config.json").is_file():
            config = json.loads((model_dir / "config.json").read_text())
            rope = (config.get("rope_parameters") or {}).get("rope_theta")  # transformers 5 moved it here
            out = {k: config[k] for k in ARCH_KEYS if k in config} | ({"rope_theta": rope} if rope else {})
            return out | {"parameters": _parameters(model_dir), "model_dir": str(model_dir)}
    return {}


def _parameters(model_dir: Path) -> str | None:
    """Parameter count from the safetensors headers (no weights read): '135.0M', '7.62B', '40'."""
    from safetensors import safe_open

    total = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(file, framework="numpy") as fh:
            total += sum(math.prod(fh.get_slice(name).get_shape()) for name in fh.keys())  # noqa: SIM118
    if not total:
        return None
    return f"{total / 1e9:.2f}B" if total >= 1e9 else f"{total / 1e6:.1f}M" if total >= 1e6 else f"{total:,}"
