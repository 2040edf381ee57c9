"""The engine's prefix-cache counters, where it reports them: (tokens looked up, tokens found).

vLLM 0.32 counts both in its Prometheus counters `vllm:prefix_cache_queries` and
`vllm:prefix_cache_hits` (vllm/v1/metrics/loggers.py, from the scheduler's prefix_cache_stats):
a server exposes them at GET /metrics (with the `_total` suffix), an offline engine built with
log stats on keeps them in its process's registry (`LLMEngine.get_metrics`). A level reads them
before and after each measured run (loadgen's `counted`, around a `Send`); the difference is the run's. An
engine or server without them gives None: the report then says "not reported", never 0.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

QUERIES, HITS = "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"


def from_prometheus(text: str, *, model: str | None = None) -> tuple[int, int] | None:
    """The two counters from a Prometheus text exposition, summed over engines (label `engine`);
    only the samples of `model` (label `model_name`) when given. None when the text has neither."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith((QUERIES, HITS)):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        name = name.removesuffix("_total")
        if name not in (QUERIES, HITS) or (model is not None and labels and f'model_name="{model}"' not in labels):
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):
            totals[name] = totals.get(name, 0.0) + number
    if QUERIES not in totals:
        return None
    return int(totals[QUERIES]), int(totals.get(HITS, 0.0))


def from_engine(engine: Any) -> tuple[int, int] | None:
    """The two counters of an in-process vLLM `LLMEngine` (None when it keeps no stats), only its
    own model's samples: several engines in one process share the registry."""
    if not getattr(engine, "log_stats", False):
        return None
    model = getattr(engine.model_config, "served_model_name", None)
    totals = {QUERIES: 0, HITS: 0}
    found = False
    for metric in engine.get_metrics():
        if metric.name in totals and (model is None or metric.labels.get("model_name") in (None, model)):
            totals[metric.name] += int(metric.value)
            found = True
    return (totals[QUERIES], totals[HITS]) if found else None
