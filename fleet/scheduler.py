"""Dispatching shards to card actors and gathering their Arrow tables as they finish.

Per model: one actor per target. Every target generates its shards; each candidate shard is
then scored by the reference actor (teacher forcing) and written with the reference's columns
joined on. A candidate's actor is shut down as soon as its shards are generated, so on a small
cluster the next target's actor can take its card while the reference stays up for scoring.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet import schema

if TYPE_CHECKING:
    import pyarrow as pa
    from tqdm import tqdm

    from actors.base import Generation, TargetArgs
    from fleet.manifest import Manifest, ModelSpec
    from fleet.plan import Shard
    from fleet.store import RunStore

# Environment every actor gets: no phoning home, from vLLM or Ray.
BASE_ENV = {"VLLM_NO_USAGE_STATS": "1", "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class Outcome:
    """What the run learnt besides rows: per model/target provenance and failures."""

    provenance: dict[str, dict[str, str]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def check_fits(manifest: Manifest, cluster: dict[str, float]) -> None:
    """Fail early when the reference and the largest candidate cannot hold cards at once:
    the reference stays up to score every candidate, so anything less would wait forever."""
    ref = manifest.target(manifest.reference)
    for cand in manifest.targets:
        need = _flat(ref.ray_resources())
        if cand.name != ref.name:
            for key, amount in _flat(cand.ray_resources()).items():
                need[key] = need.get(key, 0.0) + amount
        short = {k: v for k, v in need.items() if cluster.get(k, 0.0) < v}
        if short:
            have = {k: cluster.get(k, 0.0) for k in short}
            msg = f"targets {ref.name!r} + {cand.name!r} need {dict(short)} at once; the cluster has {have}"
            raise RuntimeError(msg)


def _flat(options: dict[str, Any]) -> dict[str, float]:
    out = {"CPU": options.get("num_cpus", 0.0), "GPU": options.get("num_gpus", 0.0)}
    return {k: v for k, v in (out | options.get("resources", {})).items() if v}


def execute(manifest: Manifest, shards: list[Shard], store: RunStore, bar: tqdm[Any]) -> Outcome:
    outcome = Outcome()
    for model in manifest.models:
        _run_model(manifest, model, [s for s in shards if s.model == model.name], store, bar, outcome)
    return outcome


def _start(target: TargetArgs, model: ModelSpec, manifest: Manifest) -> Any:
    import ray

    from actors.card import Card

    env = BASE_ENV | target.actor_env()
    options = target.ray_resources() | {"runtime_env": {"env_vars": env}, "name": None}
    return ray.remote(Card).options(**options).remote(target, model, manifest.sampling)


def _run_model(
    manifest: Manifest, model: ModelSpec, shards: list[Shard], store: RunStore, bar: tqdm[Any], outcome: Outcome
) -> None:
    import ray

    ref_name, k = manifest.reference, manifest.sampling.logprobs
    cards = {t.name: _start(t, model, manifest) for t in manifest.targets}
    left = Counter(s.target for s in shards)  # generate calls outstanding per target
    scoring = 0  # score calls outstanding on the reference
    pending: dict[Any, tuple[str, str, Any]] = {}
    for name, card in cards.items():
        pending[card.describe.remote()] = ("describe", name, None)
    for shard in shards:
        pending[cards[shard.target].generate.remote(shard)] = ("generate", shard.target, shard)

    def fail(target: str, reason: str) -> None:
        key = f"{model.name}/{target}"
        outcome.failures.setdefault(key, reason)
        bar.write(f"FAILED {key}: {reason}")
        for obj, (what, name, _) in list(pending.items()):
            if name == target and what == "generate":
                del pending[obj]
                bar.update(1)  # abandoned: counted as done so the bar still ends at 100%
        left[target] = 0
        release(target)

    def release(target: str) -> None:
        card = cards.pop(target, None)
        if card is None:
            return
        with contextlib.suppress(Exception):  # a dead actor has nothing left to shut down
            ray.get(card.shutdown.remote(), timeout=120)
        ray.kill(card)

    def finish(gen: Generation, tokens: pa.Table) -> None:
        _write(store, gen, tokens)
        bar.update(1)

    while pending:
        [done], _ = ray.wait(list(pending), num_returns=1)
        what, target, payload = pending.pop(done)
        if what == "score":
            scoring -= 1
        try:
            result = ray.get(done)
        except Exception as e:  # noqa: BLE001  (any actor or engine error fails this target only)
            if what == "score":  # the candidate's rows stand on their own; keep them unscored
                finish(payload, payload.tokens)
            elif what == "generate":
                bar.update(1)
            fail(ref_name if what == "score" else target, _reason(e))
            continue
        if what == "describe":
            outcome.provenance[f"{model.name}/{target}"] = result
        elif what == "generate":
            left[target] -= 1
            if target == ref_name or ref_name not in cards:  # no reference left to score with
                finish(result, result.tokens)
            else:
                pending[cards[ref_name].score.remote(result.requests, k=k)] = ("score", target, result)
                scoring += 1
            if left[target] == 0 and target != ref_name:
                release(target)
        else:
            finish(payload, _join_scores(payload.tokens, result))
        if not any(left.values()) and scoring == 0:
            release(ref_name)
    for target in list(cards):
        release(target)


def _reason(error: Exception) -> str:
    text = str(error).strip().splitlines()
    # Ray wraps the remote traceback; its last line is the actual error.
    return (text[-1] if text else type(error).__name__)[:500]


def _write(store: RunStore, gen: Generation, tokens: pa.Table) -> None:
    # The shards row goes last: its presence marks the shard complete (resume relies on that).
    shard_id = gen.shard.column("shard_id")[0].as_py()
    store.write("requests", shard_id, gen.requests)
    store.write("tokens", shard_id, tokens)
    store.write("shards", shard_id, gen.shard)


def _join_scores(tokens: pa.Table, scores: pa.Table) -> pa.Table:
    import polars as pl

    keys = ["prompt_id", "position"]
    joined = (
        pl.from_arrow(tokens)
        .drop(schema.SCORE_COLUMNS)  # type: ignore[union-attr]
        .join(pl.from_arrow(scores), on=keys, how="left", maintain_order="left")  # type: ignore[arg-type]
    )
    return schema.conform(joined.to_arrow(), schema.TOKENS)
