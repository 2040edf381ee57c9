"""A perf scenario's sweep: the highest request rate at which a level still meets its SLO.

As guidellm's sweep and AIPerf's adaptive scale do, the most the target serves is measured first:
probe 0 is a closed loop at the level (every slot refilled at once), its completed requests / wall
time the ceiling. If even that meets the SLO (slo_share >= min_share), it is the answer. Else probe 1
sends open-loop arrivals at `floor_rps` (the scenario's arrival pattern, its seed); a floor that
fails ends the search (no rate passes). Else each further probe bisects between the highest
passing rate and the lowest failing one (at first the ceiling), `steps` times.

Every probe is one run of the level with fresh prompts, stored as its rows (the `probe` column of
perf_requests and perf_levels, its rate in request_rate), so the curve recomputes from Parquet
(fleet/analysis/perf.py `sweep_curve`); a probe is judged here by `Slo.met`, the rule the analysis applies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from actors.arrivals import scenario_schedule

if TYPE_CHECKING:
    from actors.workloads import Request
    from fleet.contracts.engine import PerfResult
    from fleet.contracts.scenario import Scenario


# One probe's run: (its requests, their due times or None for a closed loop, its rate, its index) -> its
# rows; actors/loadgen.py hands it in, so that this module needs nothing of the load generator.
RunProbe = Callable[
    [Sequence["list[int] | Request"], "list[float] | None", "float | None", int], Awaitable["PerfResult"]
]


async def search(
    run: RunProbe, scenario: Scenario, level: int, *, prompts: Sequence[list[int] | Request]
) -> PerfResult:
    """Run the sweep's probes at `level` (each `scenario.num_requests` of `prompts`, in turn); every
    probe's rows, concatenated."""
    import pyarrow as pa

    from fleet.contracts.engine import PerfResult

    assert scenario.sweep is not None and scenario.slo is not None
    sweep, slo, n = scenario.sweep, scenario.slo, scenario.num_requests
    results: list[PerfResult] = []

    async def probe(rate: float | None) -> tuple[float, float]:
        """One run at `rate` (None: the closed loop): (completed requests / s, slo_share)."""
        index = len(results)
        batch = prompts[index * n : (index + 1) * n]
        offsets = None if rate is None else scenario_schedule(scenario, len(batch), rate=rate)
        result = await run(batch, offsets, rate, index)
        results.append(result)
        rows, [lv] = result.requests.to_pylist(), result.level.to_pylist()
        completed = sum(r["error"] is None for r in rows)
        return completed / lv["wall_s"] if lv["wall_s"] else 0.0, sum(map(slo.met, rows)) / max(len(rows), 1)

    ceiling, share = await probe(None)
    if share < sweep.min_share:
        passing, failing = sweep.floor_rps, max(ceiling, sweep.floor_rps)
        _, share = await probe(passing)
        # Nothing to bisect when the floor fails, or when it is at or above the ceiling.
        for _ in range(sweep.steps if share >= sweep.min_share and failing > passing else 0):
            rate = (passing + failing) / 2
            _, share = await probe(rate)
            passing, failing = (rate, failing) if share >= sweep.min_share else (passing, rate)
    return PerfResult(pa.concat_tables([r.requests for r in results]), pa.concat_tables([r.level for r in results]))
