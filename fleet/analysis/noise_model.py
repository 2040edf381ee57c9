"""How far a correct implementation at the candidate's precision is from the reference, measured
without the candidate, and how far the candidate is beyond that.

The reference also scores every candidate token with its precision twin: its own model cast to the
candidate's dtype and run with the other attention kernel (actors/hf_reference.py), a correct port
that differs from the reference in rounding and operation order, as any port does. At each
position |twin - reference| is what a correct implementation may differ by; |candidate -
reference| at the same positions is what the candidate does differ by.

* **noise**: the twin's p99 |dlogp| times the candidate dtype's allowance (`parity.allowance`:
  float32 10, since kernel order is all of float32's error and implementations differ in it by a
  few x; 16-bit 1, since rounding dominates). Where no twin ran (an `endpoint` or `vllm`
  reference, `parity.twin: false`), DEFAULT_TWIN_P99 for the dtype, and `noise_source` says so.
  Candidate and twin are compared over the same positions: where the twin scored only some (a
  failed twin shard), the rest are left out of both, and `noise_source` gives the count.
  The near-tie rule (fleet/analysis/divergence.py) and the excess gates use this, never the
  candidate's own error: a worse candidate gets no wider tolerance.
* **tf_excess**: the candidate's p99 |dlogp| over the noise, with a 95 % bootstrap interval over
  prompts (`tf_excess_ci_low`, `tf_excess_ci_high`; prompts, in key order, resampled BOOTSTRAP
  times, seed 0, the twin's p99 recomputed on each resample; fleet/analysis/bootstrap.py).
  `tf_excess_ci_low > 1`: the candidate is further from the reference than its precision explains,
  beyond sampling noise: a bug, not precision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from fleet.analysis import bootstrap, linear_quantile
from fleet.analysis.parity import CAND, RUN, Frame, split
from fleet.results.info import RunInfo

QUANTILE = 0.99
BOOTSTRAP = 1000
DEFAULT_ALLOWANCE = {"float32": 10.0, "bfloat16": 1.0, "float16": 1.0}
# Twin p99 |dlogp| where no twin ran: SmolLM2-135M-Instruct (30 layers), transformers eager vs SDPA
# attention over the first 1,023 tokens of actors/data/corpus.txt, measured 2026-12-02 (docs/platform.md).
DEFAULT_TWIN_P99 = {"float32": 1.05e-5, "bfloat16": 0.13, "float16": 0.016}
COLUMNS = [
    "twin_p99_abs_logprob_diff", "noise", "noise_source",
    "tf_excess", "tf_excess_ci_low", "tf_excess_ci_high", "precision_verdict",
]  # fmt: skip


@dataclass(frozen=True)
class NoiseSpec:
    """What the noise model needs from run.json: each candidate's dtype and the allowances."""

    dtypes: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (model, target) -> dtype
    allowance: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_ALLOWANCE))
    near_tie_nats: float | None = None  # the manifest's fixed near-tie threshold, if any

    @classmethod
    def from_info(cls, info: RunInfo) -> NoiseSpec:
        parity = info.manifest_resolved.get("parity") or {}
        model_dtype = {m["name"]: m.get("dtype") for m in info.manifest_resolved.get("models") or []}
        dtypes = {
            (model, t["name"]): dtype or t.get("dtype") or "bfloat16"
            for model, dtype in model_dtype.items()
            for t in info.targets
        }
        allowance = DEFAULT_ALLOWANCE | dict(parity.get("allowance") or {})
        return cls(dtypes, allowance, parity.get("near_tie_nats"))

    def dtype(self, model: str, target: str) -> str:
        return self.dtypes.get((model, target), "bfloat16")


def _abs_diffs(tokens: Frame, reference: str) -> pl.DataFrame:
    """Candidate rows with |candidate - reference| and |twin - reference| per position."""
    _, cand = split(tokens, reference)
    ref = pl.col("ref_logprob").cast(pl.Float64)
    return (
        cand.select(
            *CAND,
            cand_diff=(pl.col("logprob").cast(pl.Float64) - ref).abs(),
            twin_diff=(pl.col("twin_logprob").cast(pl.Float64) - ref).abs(),
        )
        .filter(pl.col("cand_diff").is_not_null())
        .collect()
    )


def summary(tokens: Frame, reference: str, spec: NoiseSpec | None = None) -> pl.DataFrame:
    """Per (model, candidate): the columns of COLUMNS (the module docstring says what each is)."""
    diffs = _abs_diffs(tokens, reference)
    key = pl.concat_str("prompt_set", pl.lit("\x00"), "prompt_id")  # the prompt, ordered as (set, id)
    diffs = diffs.with_columns(prompt=key.rank("dense").over(RUN).cast(pl.Int64) - 1)
    return of_diffs(diffs, spec)


def of_diffs(diffs: pl.DataFrame, spec: NoiseSpec | None = None) -> pl.DataFrame:
    """`summary` from candidate positions: model, target, prompt (0-based code of the prompt, in
    key order: the bootstrap's unit), cand_diff (never null) and twin_diff (null: no twin)."""
    spec = spec or NoiseSpec()
    rows = []
    for (model_name, target), group in diffs.group_by(RUN, maintain_order=True):
        cand = group["cand_diff"].to_numpy()
        twin = group["twin_diff"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
        figures = one(cand, twin, group["prompt"].to_numpy(), spec, str(model_name), str(target))
        rows.append({"model": model_name, "target": target} | figures)
    return frame(rows)


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """`summary`'s frame from one dict per candidate: model, target and `one`'s figures."""
    schema = {"model": pl.String, "target": pl.String} | dict.fromkeys(COLUMNS, pl.Float64)
    schema |= {"noise_source": pl.String, "precision_verdict": pl.String}
    return pl.DataFrame(rows, schema=schema).sort(RUN)


def one(
    cand: np.ndarray,
    twin: np.ndarray,
    prompt: np.ndarray,
    spec: NoiseSpec,
    model: str,
    target: str,
    *,
    cand_p99: float | None = None,
) -> dict[str, Any]:
    """One candidate's figures; `twin` is NaN where the twin did not score (or scored NaN);
    `cand_p99`: the QUANTILE of all of `cand`, when the caller has it."""
    dtype = spec.dtype(model, target)
    allowance = spec.allowance.get(dtype, 1.0)
    if np.isnan(cand).any():  # a NaN logprob: nothing here can be measured
        return dict.fromkeys(COLUMNS) | {"noise_source": "not measured: NaN logprobs"}
    twinned = ~np.isnan(twin)
    twin_values: np.ndarray | None = None
    if twinned.any():
        # Candidate and twin over the same positions: where the twin did not run (a failed twin
        # shard, a prompt it skipped) the candidate is not compared either.
        source = twin_source(dtype, allowance)
        if twinned.sum() < len(cand):
            source += f", on the {int(twinned.sum())} of {len(cand)} positions the twin scored"
        if not twinned.all():
            cand, twin_values, prompt, cand_p99 = cand[twinned], twin[twinned], prompt[twinned], None
        else:
            twin_values = twin
        twin_p99 = linear_quantile.quantile(twin_values, QUANTILE)
    else:
        source = default_source(dtype, allowance)
        twin_p99 = DEFAULT_TWIN_P99.get(dtype, DEFAULT_TWIN_P99["bfloat16"])
    noise = twin_p99 * allowance
    cand_q = linear_quantile.quantile(cand, QUANTILE) if cand_p99 is None else cand_p99
    excess = cand_q / noise if noise > 0 else None
    # Prompts renumbered 0..P-1 over those left, in key order: the bootstrap's resampling unit.
    present = np.bincount(prompt) > 0
    if not present.all():  # prompts left without a value: renumbered without gaps, order kept
        prompt = (np.cumsum(present) - 1)[prompt]
    low, high = bootstrap.interval(
        cand, twin_values, prompt, twin_p99=twin_p99, allowance=allowance, quantile=QUANTILE, resamples=BOOTSTRAP
    )
    return figures(twin_p99 if twin_values is not None else None, noise, source, excess, (low, high))


def figures(
    twin_p99: float | None, noise: float, source: str, excess: float | None, ci: tuple[float, float]
) -> dict[str, Any]:
    """`one`'s row from its parts (fleet/analysis/from_tails.py computes them from aggregates)."""
    low, high = ci
    return {
        "twin_p99_abs_logprob_diff": twin_p99,
        "noise": noise,
        "noise_source": source,
        "tf_excess": excess,
        "tf_excess_ci_low": low,
        "tf_excess_ci_high": high,
        "precision_verdict": _verdict(low, high),
    }


def twin_source(dtype: str, allowance: float) -> str:
    """noise_source where the twin scored every position."""
    return f"precision twin ({dtype}) x {allowance:g}"


def default_source(dtype: str, allowance: float) -> str:
    """noise_source where no twin ran."""
    return f"default for {dtype} (no twin ran; SmolLM2-135M measurement) x {allowance:g}"


def _verdict(low: float | None, high: float | None) -> str | None:
    if low is None or high is None:
        return None
    if low > 1:
        return "exceeds precision"
    return "within precision" if high <= 1 else "within precision (interval reaches above 1)"
