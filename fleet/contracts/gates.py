"""Gate specs: a threshold on one named metric, applied per model x candidate target.

The metric names are declared here with where their rows live, so a manifest or gates file can
be validated without the analysis code; fleet/analysis/gates.py evaluates them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Literal

from pydantic import Field, field_validator, model_validator

from fleet.contracts.base import Strict
from fleet.contracts.errors import UserError
from fleet.contracts.inputs import check_name
from fleet.contracts.messages import unknown

Op = Literal[">=", "<=", ">", "<"]
OPS: dict[Op, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
# Where each metric's rows live: (table, whether the reference's rows are part of it, extra filter).
_FIRST = ("tokens", True, 'pl.col("position") == 0')
_SEQ = ("requests", True, "")
_PREFIX = ("tokens", True, "")  # r and MAE pair candidate and reference rows by position
_TF = ("tokens", False, "")  # the ref_* columns sit on the candidate's own rows
_SHARDS = ("shards", False, "")
_LATENCY = ("requests", False, "")
_LOAD = ("load_tokens", False, "")
METRICS: dict[str, tuple[str, bool, str]] = {
    "n_prompts": _SEQ,
    "first_top1_agreement": _FIRST,
    "first_logprob_diff_mean": _FIRST,
    "first_prob_rel_err_mean": _FIRST,
    "seq_match_rate": _SEQ,
    "token_match_rate": _SEQ,
    "tokens_matched": _SEQ,
    "tokens_total": _SEQ,
    "pearson_r": _PREFIX,
    "mae": _PREFIX,
    "tf_top1_agreement": _TF,
    "tf_max_abs_logprob_diff": _TF,
    "tf_mean_abs_logprob_diff": _TF,
    "first_divergence_mean": _SEQ,
    "n_diverged": _SEQ,
    "kl_topk_mean": _TF,
    # Near ties vs real divergences (fleet/analysis/divergence.py): free-running rows plus the
    # teacher-forced columns at the divergence.
    "near_ties": _PREFIX,
    "real_divergences": _PREFIX,
    "first_top1_agreement_excl_ties": _PREFIX,
    "seq_match_rate_excl_ties": _PREFIX,
    # A matrix variant's real divergences from the variants differing from it in one setting
    # (fleet/analysis/consistency.py), by the same near-tie rule.
    "consistency_real_divergences": _PREFIX,
    "tf_p99_abs_logprob_diff": _TF,
    # The noise model (fleet/analysis/noise_model.py): the candidate's p99 over its precision twin's.
    "twin_p99_abs_logprob_diff": _TF,
    "tf_excess": _TF,
    "tf_excess_ci_low": _TF,
    "tf_excess_ci_high": _TF,
    "n_requests": _LATENCY,
    "output_tokens": _SHARDS,
    "wall_s": _SHARDS,
    "output_tok_s": _SHARDS,
    **{f"{m}_p{q}_s": _LATENCY for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)},
    # Probe metrics (issue 6), measured once their tables exist; passed to evaluate() as `extra`.
    "task_accuracy_delta": ("requests", True, 'pl.col("expected").is_not_null()'),
    # The target's own accuracy (%): on the reference, it says whether the delta gate can fail at all.
    "accuracy_pct": ("requests", False, 'pl.col("expected").is_not_null()'),
    "layer_cosine_min": ("layers", True, ""),
    "layer_rel_l2_max": ("layers", True, ""),
    "logits_cosine_min": ("logits", True, ""),
    "logits_kl_max": ("logits", True, ""),
    # The Qwen2.5 report's verdict (002 5.5): normalized MSE, top-1 / top-5 over the full vocabulary.
    "logits_nmse_max": ("logits", True, ""),
    "logits_top1_agreement": ("logits", True, ""),
    "logits_top5_agreement": ("logits", True, ""),
    "layer_rel_l2_mean": ("layers", True, ""),  # the Llama-3.2 report's "average Rel L2" (001 4.2)
}
# Perf-scenario figures (fleet/analysis/perf.py), one value per scenario and concurrency level:
# a gate on them names both (`scenario`, `level`). Prefixed `perf_` so that `perf_output_tok_s`
# (a perf level) and `output_tok_s` (parity shards) are never confused.
PERF_COLUMNS = (
    "qps", "output_tok_s", "total_tok_s", "prefill_tok_s", "n_errors", "goodput_qps", "goodput_tok_s", "slo_share",
    *(f"{m}_{s}_s" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p99")),
)  # fmt: skip
METRICS |= {f"perf_{c}": ("perf_requests", False, "") for c in PERF_COLUMNS}
# Parity under load (fleet/analysis/load_parity.py): the most real divergences at any level of any
# scenario with `parity:`, from the reference and from the same prompts alone; gate both `<= 0`.
METRICS |= {"load_real_divergences": _LOAD, "load_batch_real_divergences": _LOAD}
# The perf figures a run baseline can judge: those fleet/analysis/baseline.py recomputes on a
# resample of a level's requests (rates and latency statistics; not counts, nor goodput, whose
# SLO the baseline run may not share).
RESAMPLED = frozenset(
    f"perf_{c}"
    for c in PERF_COLUMNS
    if c in ("qps", "output_tok_s", "total_tok_s", "prefill_tok_s") or c.split("_")[0] in ("ttft", "tpot", "itl", "e2e")
)
LATEST_PASS = "latest-pass"
MAX_BASELINE_RUNS = 20


class Gate(Strict):
    """One threshold on one metric, applied to every selected model x target."""

    metric: str = Field(description="Metric name: a column of analysis.parity/throughput or a probe metric.")
    op: Op = Field(description="Comparison, measured OP bound: >=, <=, > or < (quote it in YAML).")
    threshold: float | None = Field(None, description="The bound, without a baseline (then `ratio` sets it).")
    baseline: float | dict[str, float] | str | list[str] | None = Field(
        None,
        description="What `ratio` multiplies: a stored number (one, or by 'model/target' or 'target'), or runs "
        "in the same results root: a run id, a list of run ids (their mean), or latest-pass (the newest earlier "
        "run that passed, with this model and target; with `runs`, the newest that many). A run baseline is "
        "judged on a 95 % bootstrap interval of measured / baseline; with several runs it holds their spread.",
    )
    runs: int | None = Field(
        None,
        ge=1,
        le=MAX_BASELINE_RUNS,
        description="With baseline: latest-pass, how many (1-20) earlier passing runs form the baseline (default 1). "
        "On a host whose runs differ by more than the margin, several runs put that spread into the interval.",
    )
    ratio: float | None = Field(
        None, gt=0, le=1000, description="With `baseline`: the bound is ratio x baseline (e.g. 0.97 for a 3 % margin)."
    )
    models: list[str] | None = Field(None, min_length=1, description="Models to check (default: all).")
    targets: list[str] | None = Field(
        None, min_length=1, description="Targets to check (default: every candidate; the reference only if named)."
    )
    name: str | None = Field(
        None, max_length=200, description="Label in the verdict table (default: 'metric op threshold')."
    )
    scenario: str | None = Field(None, description="For perf_* metrics: the perf scenario (required there).")
    level: int | None = Field(
        None, ge=1, le=4096, description="For perf_* metrics: the concurrency level (required there)."
    )

    @model_validator(mode="after")
    def _bound_or_ratio(self) -> Gate:
        # One name per concept: `threshold` is a bound, `ratio` a factor of a baseline.
        if self.baseline is None and self.ratio is not None:
            msg = "ratio multiplies a baseline: set baseline too (a number, a run id, or latest-pass)"
            raise ValueError(msg)
        if self.baseline is None and self.threshold is None:
            msg = "set threshold (the bound), or baseline and ratio (the bound is ratio x baseline)"
            raise ValueError(msg)
        if self.baseline is not None and self.threshold is not None:
            msg = f"with a baseline the factor is ratio, not threshold: write ratio: {self.threshold:g}"
            raise ValueError(msg)
        if self.baseline is not None and self.ratio is None:
            msg = "a baseline needs ratio, the factor of the bound (e.g. ratio: 0.97)"
            raise ValueError(msg)
        if self.runs is not None and self.baseline != LATEST_PASS:
            msg = "runs counts latest-pass's runs: set baseline: latest-pass, or name the runs (baseline: [a, b, c])"
            raise ValueError(msg)
        if self.baseline_runs and self.metric not in RESAMPLED:
            msg = (
                f"a run baseline ({', '.join(self.baseline_runs)}) is judged on a bootstrap over a perf level's "
                "requests: it takes perf rates (perf_qps, perf_output_tok_s, perf_total_tok_s, perf_prefill_tok_s) "
                "and latency figures (perf_ttft_*, perf_tpot_*, perf_itl_*, perf_e2e_*); "
                f"for {self.metric} give a stored number"
            )
            raise ValueError(msg)
        return self

    @field_validator("baseline")
    @classmethod
    def _run_names(cls, value: object) -> object:
        if isinstance(value, list):
            if not value:
                msg = "a list of baseline runs names at least one run id"
                raise ValueError(msg)
            if LATEST_PASS in value:
                msg = f"{LATEST_PASS} stands alone (with runs: k for the newest k), not in a list of run ids"
                raise ValueError(msg)
            if len(set(value)) < len(value):
                msg = f"baseline runs repeat a run id: {', '.join(value)}"
                raise ValueError(msg)
            if len(value) > MAX_BASELINE_RUNS:
                msg = f"at most {MAX_BASELINE_RUNS} baseline runs, not {len(value)}"
                raise ValueError(msg)
        for name in value if isinstance(value, list) else [value]:
            if isinstance(name, str) and name != LATEST_PASS:
                try:  # a run id is a directory name: the rule fleet run's --run-id follows
                    check_name(name, what="baseline")
                except UserError as e:
                    raise ValueError(f"{e} (or {LATEST_PASS})") from None
        return value

    @model_validator(mode="after")
    def _perf_needs_scenario_and_level(self) -> Gate:
        is_perf = self.metric.startswith("perf_")
        if is_perf and (self.scenario is None or self.level is None):
            msg = f"{self.metric} is a perf-scenario figure: set scenario and level (e.g. scenario: decode, level: 8)"
            raise ValueError(msg)
        if not is_perf and (self.scenario is not None or self.level is not None):
            msg = f"scenario and level apply to perf_* metrics only, not {self.metric}"
            raise ValueError(msg)
        return self

    @property
    def key(self) -> str:
        """The measured value's name: the metric, and for perf figures its scenario and level."""
        return self.metric if self.scenario is None else perf_key(self.metric, self.scenario, self.level or 0)

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        if value not in METRICS:
            raise ValueError(unknown("metric", value, METRICS, listed='docs/metrics.md "Gate metric ids"'))
        return value

    @field_validator("threshold")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            msg = "threshold must be a finite number"
            raise ValueError(msg)
        return value

    @property
    def baseline_runs(self) -> tuple[str, ...]:
        """The runs this gate compares with (run ids, or latest-pass alone); () for a stored number."""
        if isinstance(self.baseline, str):
            return (self.baseline,)
        return tuple(self.baseline) if isinstance(self.baseline, list) else ()

    @property
    def label(self) -> str:
        where = f" [{self.scenario} @ {self.level}]" if self.scenario is not None else ""
        if self.baseline is None:
            return self.name or f"{self.metric}{where} {self.op} {self.threshold:g}"
        against = ", ".join(self.baseline_runs) or "baseline"
        if (self.runs or 1) > 1:
            against += f" ({self.runs} runs)"
        return self.name or f"{self.metric}{where} {self.op} {self.ratio:g} x {against}"

    def bound(self, model: str, target: str) -> tuple[float | None, float | None]:
        """(effective threshold, baseline used) for a stored baseline; (None, None) when it has no
        entry for the target. A run baseline's value comes from that run (fleet/analysis/baseline.py)."""
        if self.baseline is None:
            return self.threshold, None
        base = self.baseline if isinstance(self.baseline, float | int) else None
        if isinstance(self.baseline, dict):
            base = self.baseline.get(f"{model}/{target}", self.baseline.get(target))
        return (None, None) if base is None else ((self.ratio or 0.0) * base, float(base))


def perf_key(metric: str, scenario: str, level: int) -> str:
    """How a perf figure is named among a target's metrics: `perf_output_tok_s@decode@8`."""
    return f"{metric}@{scenario}@{level}"
