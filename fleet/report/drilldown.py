"""The drill-down as a report shows it, and the msprobe configuration that takes it to the operators.

`view` computes, from a run's `drilldown` rows, the error-growth curves and the first layer past
precision (fleet/analysis/drilldown.py). `write_msprobe_configs` writes, per real divergence, a
ready msprobe `config.json` into the run directory (`msprobe/MODEL/CANDIDATE/SET-PROMPT-stepN.json`):
a tensor dump of that engine step and of the layer range around the first layer past precision,
which vllm-ascend loads with `--additional-config '{"dump_config": "PATH"}'` (docs/metrics.md#drill-down
says what each field is and cites msprobe's documentation).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from fleet.analysis import drilldown
from fleet.analysis.noise_model import NoiseSpec
from fleet.results import reader
from fleet.results.store import RunStore, join

if TYPE_CHECKING:
    from fleet.results.info import RunInfo

MSPROBE_DIR = "msprobe"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def margin(info: RunInfo) -> float:
    options = info.manifest_resolved.get("drilldown") or {}
    return float(options.get("margin") or drilldown.DEFAULT_MARGIN)


def view(frame: pl.DataFrame | None, info: RunInfo) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(curve, first): every (layer, kind) row of every probed target per divergence, and the first
    past precision per probed target, with `config`, the msprobe configuration's path in the run."""
    if frame is None or frame.is_empty():
        return pl.DataFrame(), pl.DataFrame()
    curve = drilldown.curve(frame, info.reference, spec=NoiseSpec.from_info(info), margin=margin(info))
    first = drilldown.first_exceeding(curve)
    if first.is_empty():
        return curve, first
    return curve, first.with_columns(config=pl.Series([config_path(r) for r in first.iter_rows(named=True)]))


def config_path(row: dict[str, Any]) -> str | None:
    """Where the divergence's msprobe configuration lies in the run directory (None: no layer exceeds)."""
    if row["first_layer"] is None:
        return None
    name = f"{row['prompt_set']}-{row['prompt_id']}-step{row['step']}.json"
    return "/".join(_UNSAFE.sub("_", part) for part in (MSPROBE_DIR, row["model"], row["diverging"], name))


def modules(layer: int, kind: str) -> list[str]:
    """msprobe `list` entries for the first layer past precision and the last one within it. With
    level "mix" an entry that is part of a module's name expands that module: every API it calls is
    dumped. Probe layer i (1-based) is module `layers.{i-1}` in transformers and vLLM alike; the
    trailing dot keeps "layers.1." from matching layers 10-19."""
    if kind == "embed":
        return ["embed_tokens"]
    if kind == "norm":
        return [f"layers.{layer - 2}.", "model.norm"]
    part = {"attention": "self_attn", "mlp": "mlp"}.get(kind, "")
    before = [f"layers.{layer - 2}."] if layer >= 2 else ["embed_tokens"]
    return [*before, f"layers.{layer - 1}.{part}"]


def msprobe_config(row: dict[str, Any], *, dump_path: str) -> dict[str, Any]:
    """msprobe's config.json for one divergence (fields: docs/metrics.md#drill-down): the real
    tensors (task "tensor") of the engine step that chose the divergent token, for the modules
    around the first layer past precision, and every API they call (level "mix")."""
    return {
        "task": "tensor",
        "dump_path": dump_path,
        "rank": [],
        "step": [int(row["step"])],
        "level": "mix",
        "async_dump": False,
        "tensor": {"scope": [], "list": modules(int(row["first_layer"]), row["first_kind"]), "data_mode": ["all"]},
    }


def write_msprobe_configs(run_dir: str | Path) -> list[str | Path]:
    """Write every divergence's msprobe configuration into the run directory; returns their paths.
    Where several targets were probed at one divergence, the diverging target's own finding is
    used, else the first probed target's that has one."""
    info = reader.read_info(run_dir)
    with reader.decoding(run_dir):
        table = reader.load(run_dir)["drilldown"].collect()
    _, first = view(table, info)
    if first.is_empty():
        return []
    chosen = (
        first.filter(pl.col("config").is_not_null())
        .sort(pl.col("target") != pl.col("diverging"), "target")
        .group_by(*drilldown.POINT, maintain_order=True)
        .first()
    )
    store, written = RunStore(run_dir), []
    for row in chosen.iter_rows(named=True):
        name = row["config"].removeprefix(f"{MSPROBE_DIR}/").removesuffix(".json")
        config = msprobe_config(row, dump_path=f"./msprobe-dump/{name}")
        store.write_text(row["config"], json.dumps(config, indent=2) + "\n")
        written.append(join(run_dir, *row["config"].split("/")))
    return written
