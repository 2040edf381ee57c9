"""A perf level's figures on bootstrap resamples of its requests: the interval `fleet compare`
prints beside a perf delta, and the one a gate against a baseline run judges (fleet/analysis/baseline.py).

The resampling unit is the request (the report's parity intervals resample prompts the same way,
fleet/analysis/bootstrap.py, whose count-based quantiles this reuses). Every figure is the one
fleet/analysis/perf.py gives, recomputed on the drawn requests:

* latency means and quantiles (ttft, tpot, e2e over requests; itl over every gap of the drawn
  requests, each gap drawn with its request) directly;
* prefill_tok_s as drawn prompt tokens / drawn TTFT;
* rates (output_tok_s, total_tok_s, qps) need the level's wall time, which is no per-request
  quantity: on a resample it scales with the drawn requests' summed e2e. A level keeps its slots
  busy, so its wall is their summed service time over the level; a resample's rate is the measured
  rate x (drawn tokens / all tokens) / (drawn e2e / all e2e). With every request drawn once it is
  the measured figure exactly;
* goodput_qps and goodput_tok_s as rates of the drawn requests that met the scenario's SLO,
  slo_share as their share, n_errors as the drawn failed requests.

The parity runs' requests resample the same way for their latency quantiles (`parity_runs`).

What a request resample does not hold is a whole run being slower (a busier machine that day):
that moves every request alike. A gate's `ratio` is the margin for it, or its baseline is several
runs (`runs_ratios`): a two-level bootstrap, runs and then requests within each (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from fleet.analysis import perf
from fleet.analysis.bootstrap import draws, resampled_quantiles

RESAMPLES = 2000
LEVEL = 0.95  # the interval's coverage
_RATES = {"qps", "output_tok_s", "total_tok_s"}
_GOODPUT = {"goodput_qps", "goodput_tok_s", "slo_share"}  # a request counts when it met the SLO


@dataclass(frozen=True)
class Level:
    """One level's requests as arrays (a failed request: not done, no latency), and its wall time."""

    done: np.ndarray
    n_out: np.ndarray  # output tokens of completed requests (0 for failed ones, as perf.py counts)
    n_prompt: np.ndarray
    latency: dict[str, np.ndarray]  # ttft, tpot, e2e: NaN where not measured
    itl: np.ndarray  # every gap of every completed request
    itl_request: np.ndarray  # the request of each gap
    wall_s: float
    good: np.ndarray | None = None  # 1.0 where the request met its scenario's SLO, else 0.0 (None: no SLO)

    @classmethod
    def of(cls, requests: pl.DataFrame, wall_s: float) -> Level:
        """From one level's perf_requests rows and its perf_levels wall_s (a `_good` column, as
        `levels` adds: whether each request met the scenario's SLO)."""
        done = requests["error"].is_null().to_numpy()
        good = requests["_good"] if "_good" in requests.columns else None

        def column(name: str) -> np.ndarray:
            values = requests[name].cast(pl.Float64).fill_null(np.nan).to_numpy().copy()
            values[~done] = np.nan
            return values

        gaps = requests.select(pl.int_range(pl.len()).alias("request"), "itl_s", "error")
        gaps = gaps.filter(pl.col("error").is_null()).explode("itl_s").drop_nulls("itl_s")
        return cls(
            done=done,
            n_out=np.where(done, requests["n_output_tokens"].cast(pl.Float64).fill_null(0).to_numpy(), 0.0),
            n_prompt=np.where(done, requests["n_prompt_tokens"].cast(pl.Float64).fill_null(0).to_numpy(), 0.0),
            latency={m: column(f"{m}_s") for m in ("ttft", "tpot", "e2e")},
            itl=gaps["itl_s"].to_numpy(),
            itl_request=gaps["request"].to_numpy(),
            wall_s=float(wall_s),
            good=None if good is None or good.null_count() == len(good) else good.cast(pl.Float64).to_numpy(),
        )

    @property
    def n_requests(self) -> int:
        return len(self.done)

    def _wall(self, w: np.ndarray) -> np.ndarray:
        """Each resample's wall time: the level's, scaled by the drawn requests' summed e2e."""
        e2e = np.nan_to_num(self.latency["e2e"])
        return self.wall_s * (w @ e2e) / e2e.sum()

    def figure(self, column: str, drawn: np.ndarray) -> np.ndarray:
        """`column` of perf.summary (e.g. output_tok_s, ttft_p99_s) on each resample (rows of `drawn`)."""
        w = drawn.astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            if column == "n_errors":
                return w @ ~self.done
            if column in _GOODPUT:
                if self.good is None:  # the scenario sets no SLO: the figure is null
                    return np.full(len(w), np.nan)
                if column == "slo_share":
                    return (w @ self.good) / w.sum(axis=1)
                good = self.good if column == "goodput_qps" else self.good * self.n_out
                return (w @ good) / self._wall(w)
            if column in _RATES:
                numerator = {"qps": self.done.astype(float), "output_tok_s": self.n_out}.get(
                    column, self.n_out + self.n_prompt
                )
                return (w @ numerator) / self._wall(w)
            if column == "prefill_tok_s":
                ttft = self.latency["ttft"]
                measured = ~np.isnan(ttft)
                return (w @ np.where(measured, self.n_prompt, 0.0)) / (w @ np.nan_to_num(ttft))
            name, stat, _ = column.split("_")
            if name == "itl":
                values, unit = self.itl, self.itl_request
            else:
                values = self.latency[name]
                unit = np.flatnonzero(~np.isnan(values))
                values = values[unit]
            if stat == "mean":
                sums = np.bincount(unit, weights=values, minlength=self.n_requests)
                counts = np.bincount(unit, minlength=self.n_requests)
                return (w @ sums) / (w @ counts)
            return resampled_quantiles(values, unit, drawn, int(stat[1:]) / 100)


def bounds(values: np.ndarray) -> tuple[float, float]:
    """The LEVEL interval of resampled figures (NaN, NaN: most resamples undefined)."""
    finite = values[np.isfinite(values)]
    if len(finite) < len(values) * LEVEL:  # most resamples undefined: no interval to give
        return float("nan"), float("nan")
    low, high = np.quantile(finite, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(low), float(high)


def delta_intervals(
    columns: Iterable[str], a: Level, b: Level, *, resamples: int = RESAMPLES, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """column -> 95 % interval of b - a, both runs' requests resampled independently: one set of
    draws per run for every figure."""
    rng = np.random.default_rng(seed)
    drawn_a, drawn_b = draws(rng, a.n_requests, resamples), draws(rng, b.n_requests, resamples)
    return {column: bounds(b.figure(column, drawn_b) - a.figure(column, drawn_a)) for column in columns}


def levels(
    requests: pl.DataFrame, levels_table: pl.DataFrame, *, slos: Mapping[str, Mapping[str, float | None]] | None = None
) -> dict[tuple[str, str, str, int], Level]:
    """(model, target, scenario, level) -> its Level, from a run's perf_requests and perf_levels;
    with `slos` (perf.slos) its requests know whether they met their scenario's SLO (goodput)."""
    requests, levels_table = perf.first_runs(requests), perf.first_runs(levels_table)
    if slos:
        requests = requests.with_columns(_good=perf.met_slo(slos))
    keys = ["model", "target", "scenario", "level"]
    walls = {tuple(r[:4]): r[4] for r in levels_table.select(*keys, "wall_s").iter_rows()}
    out = {}
    for key, part in requests.group_by(keys, maintain_order=True):
        wall = walls.get(tuple(key))
        if wall is not None and part.height:
            out[(str(key[0]), str(key[1]), str(key[2]), int(key[3]))] = Level.of(part.sort("request_index"), wall)
    return out


PARITY_LATENCIES = [f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)]


def parity_runs(requests: pl.DataFrame) -> dict[tuple[str, str], Level]:
    """(model, target) -> its parity requests as a Level (no wall time: their latency quantiles only,
    throughput.throughput's PARITY_LATENCIES; the requests in key order)."""
    no_gaps = pl.lit(None, pl.List(pl.Float64))
    rows = requests.with_columns(error=pl.lit(None, pl.String), itl_s=no_gaps).sort("prompt_set", "prompt_id")
    return {
        (str(model), str(target)): Level.of(part, float("nan"))
        for (model, target), part in rows.group_by("model", "target", maintain_order=True)
    }


def level_draws(level: Level, *, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """[resamples, requests]: how often each request of `level` is drawn in each resample, drawn once
    per level and run and reused by every figure gated there (int32 to keep it small)."""
    return draws(np.random.default_rng(seed), level.n_requests, resamples).astype(np.int32)


def runs_ratios(
    measured: np.ndarray, baselines: Sequence[np.ndarray], observed: Sequence[float], *, seed: int = 0
) -> np.ndarray:
    """measured / baseline on each resample, for a baseline of k runs (their mean).

    `measured` holds the measured run's figure on each resample of its requests, `baselines` each
    baseline run's figure on resamples of its own, `observed` each baseline run's reported figure.
    Resample r divides the measured run's r-th figure by

    * the mean of k baseline runs drawn with replacement, each read at one of its request resamples
      picked at random: the two levels, runs and then requests within each run;
    * and by a run effect: one more baseline run drawn, its figure over the baselines' mean. The
      measured run is one run too, and may have come out as fast or slow as the baseline's runs
      differ; it cannot show that itself, so it borrows their spread. Without it the interval
      narrows as 1/sqrt(k) while the measured run's own run-to-run deviation does not, and more
      repeats would fail healthy runs more often.

    With one baseline run the effect is 1 and this is the request-only interval."""
    figures = np.stack(baselines)  # [k, resamples]
    k, resamples = figures.shape
    rng = np.random.default_rng(seed)
    runs = rng.integers(0, k, (len(measured), k))
    mean = figures[runs, rng.integers(0, resamples, runs.shape)].mean(axis=1)
    observed_runs = np.asarray(observed, dtype=float)
    effect = observed_runs[rng.integers(0, k, len(measured))] / observed_runs.mean()
    with np.errstate(divide="ignore", invalid="ignore"):
        return measured / (mean * effect)


def spread(observed: Sequence[float]) -> float:
    """The run-to-run spread of a figure: the standard deviation of its runs over their mean (NaN for one run)."""
    values = np.asarray(observed, dtype=float)
    return float(values.std(ddof=1) / values.mean()) if len(values) > 1 else float("nan")
