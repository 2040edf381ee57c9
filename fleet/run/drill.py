"""The drill-down's work (`drilldown:` in the manifest): once a model's parity rows are stored, a
layer probe at each real divergence's prefix, on the reference, on its precision twin at each
diverging candidate's dtype, and on the manifest's hf candidates.

Which divergences are real is the analysis' rule (fleet/analysis/divergence.py), which the driver
cannot import (fleet.analysis sits beside fleet.run): `fleet run` hands the driver a function that
reads them from the stored rows (`DrillPoints`, fleet/analysis/drilldown.py's `points`). The probe
itself is the layer probe's (`probe_layers`, with its attention and MLP outputs), fed token ids:
prompt + the output the candidate and the reference share, so its last position is the one whose
next token they disagree on. The rows go to the `drilldown` table with the divergence they reproduce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.contracts import probe_schema, schema
from fleet.contracts.engine import Prefix
from fleet.contracts.spec import DrillPoint
from fleet.run.plan import DrillCall, ModelPlan
from fleet.run.work import Effects, Work, Write

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet.run.manifest import Manifest
    from fleet.run.work import SlotView


# (run_dir, model) -> the model's real divergences, read from the rows stored so far.
DrillPoints = Callable[[str | Path, str], list[DrillPoint]]


def drill_plans(manifest: Manifest, points: dict[str, list[DrillPoint]]) -> list[ModelPlan]:
    """One plan per model with divergences: the reference's probe (own model, and its twin at each
    diverging candidate's dtype) over all of them; an hf candidate's over its own divergences and,
    standing in as HF on the same card, those of candidates that give no hidden states (vLLM)."""
    plans = []
    for model, found in points.items():
        if not found:
            continue
        spec = manifest.model(model)
        dtypes = sorted({spec.dtype or manifest.target(p.diverging).dtype for p in found})
        calls = [DrillCall(model, manifest.reference, twin, tuple(found)) for twin in [None, *dtypes]]
        for name in manifest.drilled():
            mine = [p for p in found if p.diverging == name or not manifest.target(p.diverging).can("probe_layers")]
            calls += [DrillCall(model, name, None, tuple(mine))] if mine else []
        plans.append(ModelPlan(model, [], [], [], drills=calls))
    return plans


@dataclass(frozen=True)
class Drill(Work):
    """One `DrillCall`: the layer probe (with sub-layers) at the last position of every prefix."""

    call: DrillCall

    @property
    def label(self) -> str:
        return "drilldown"

    def submit(self, slot: SlotView) -> tuple[Any, float]:
        prefixes = [Prefix(str(i), p.token_ids) for i, p in enumerate(self.call.points)]
        call = slot.handle.probe_layers.remote(
            prefixes, prompt_set="drilldown", positions="last", sublayers=True, twin=self.call.twin
        )
        return call, slot.manifest.run.shard_timeout_s

    def on_result(self, slot: SlotView, result: pa.Table) -> Effects:
        return Effects(writes=(Write("drilldown", self.call.key, drilldown_rows(result, self.call)),))

    def on_abandon(self, slot: SlotView, reason: str) -> Effects:
        return Effects(failed_shard=(self.call.key, reason))


def drilldown_rows(layers: pa.Table, call: DrillCall) -> pa.Table:
    """The layer probe's rows (prompt ids are indexes into the call's points) as `drilldown` rows."""
    import pyarrow as pa

    points = [call.points[int(i)] for i in layers.column("prompt_id").to_pylist()]
    n = layers.num_rows
    columns = {
        "prompt_set": pa.array([p.prompt_set for p in points], pa.string()),
        "prompt_id": pa.array([p.prompt_id for p in points], pa.string()),
        "diverging": pa.array([p.diverging for p in points], pa.string()),
        "step": pa.array([p.step for p in points], pa.int32()),
        "twin_dtype": pa.array([call.twin] * n, pa.string()),
    }
    table = layers
    for name, values in columns.items():
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, values)
        else:
            table = table.append_column(name, values)
    return schema.conform(table, probe_schema.DRILLDOWN)
