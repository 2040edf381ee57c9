"""The lines under the performance-scenario table (fleet.report.sections places them): each
scenario's test conditions as the manifest set them (its prompts, token counts and arrivals),
which targets loaded dummy weights, and which levels the load generator may have paced.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from fleet.analysis import perf
from fleet.report.blocks import Block
from fleet.results.info import RunInfo


def conditions(info: RunInfo) -> list[str]:
    """Each perf scenario's test conditions, and which targets loaded dummy weights (their speed is
    a real figure, their outputs are not)."""
    out = [
        f"{s['name']}: {s['num_requests']} requests per level at concurrency {s['concurrency']}, "
        + _prompts(s)
        + f", {_count(s['output_tokens'])} output tokens "
        + ("(ignore_eos)" if s.get("ignore_eos", True) else "(at most: free output)")
        + f", warm-up {s['warmup_requests']}, "
        + _arrivals(s)
        for s in info.perf
    ]
    dummies = [t["name"] for t in info.targets if (t.get("engine_args") or {}).get("load_format") == "dummy"]
    return out + ([f"dummy-weight targets (load_format: dummy): {', '.join(dummies)}"] if dummies else [])


def _prompts(s: dict[str, Any]) -> str:
    """What a scenario's prompts were: their source, their structure and how they were sent."""
    if s.get("trace"):
        return f"trace {s['trace']} replayed at its own times (sent as {s.get('send', 'ids')})"
    if not s.get("input_tokens"):
        return f"prompts of set {s['prompt_set']}"
    text = f"{_count(s['input_tokens'])} input tokens"
    if prefix := s.get("shared_prefix"):
        text += f" after a shared prefix of {prefix['prefix_tokens']} ({prefix['groups']} groups)"
    if turns := s.get("multi_turn"):
        text += f" per turn, {turns['turns']}-turn conversations re-sending their history"
    sent = {"ids": "", "text": ", sent as text", "chat": ", sent as chat (counted after the chat template)"}
    return text + sent[s.get("send", "ids")]


def _count(value: int | dict[str, Any]) -> str:
    """A token count or its distribution, as the manifest gave it."""
    if isinstance(value, int):
        return str(value)
    if value["distribution"] == "fixed":
        return str(value["mean"])
    if value["distribution"] == "uniform":
        return f"uniform {value['min']}-{value['max']}"
    return f"normal({value['mean']}, {value['std']:g}) in {value['min']}-{value['max']}"


def _arrivals(scenario: dict[str, Any]) -> str:
    if scenario.get("trace"):
        clients = f", {scenario['clients']} client processes" if (scenario.get("clients") or 1) > 1 else ""
        return f"arrivals at the trace's times{clients}"
    rate, shape, ramp, sweep = (scenario.get(k) for k in ("request_rate", "burstiness", "ramp", "sweep"))
    gaps = "evenly spaced" if scenario.get("arrival") == "constant" else (
        "Poisson" if shape in (None, 1) else f"gamma gaps of burstiness {shape:g}"
    )  # fmt: skip
    clients = f", {scenario['clients']} client processes" if (scenario.get("clients") or 1) > 1 else ""
    if sweep:
        return f"a sweep from {sweep['floor_rps']:g}/s to the closed loop's rate, {gaps}{clients}"
    if ramp:
        how = f"{ramp['strategy']} ramp from {ramp['start_rps']:g}/s to {ramp['end_rps']:g}/s"
        return f"arrivals on a {how}, {gaps}{clients}"
    if rate is None:
        return f"closed loop{clients}"
    return f"arrivals at {rate:g}/s, {gaps}{clients}"


def client_bound(scenarios: pl.DataFrame | None) -> list[Block]:
    """A warning naming the levels whose client may have set the pace (fleet/analysis/perf.py's rule)."""
    if scenarios is None or "client_bound" not in scenarios.columns:
        return []
    flagged = scenarios.filter(pl.col("client_bound").fill_null(False))
    if flagged.is_empty():
        return []
    where = ", ".join(f"{t} / {s} @ {lv}" for t, s, lv in flagged.select("target", "scenario", "level").iter_rows())
    return [
        f"Client-bound (send lag p99 > {perf.CLIENT_LAG_S * 1000:g} ms or client CPU > "
        f"{perf.CLIENT_CPU_SHARE:.0%} of a core): {where}. These figures may measure the load generator, not "
        "the target: spread the load over more client processes (the scenario's clients) or nodes."
    ]
