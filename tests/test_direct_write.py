"""Engines that write their own rows (run.write: actors, fleet/results/direct.py): which runs take
that path, the same rows as the driver path, and exactly-once through real kills: an actor SIGKILLed
after it stored a shard and before the driver committed it, and a driver SIGKILLed between commits.

The engines are the labelled `test-double` backend (tests/test_faults.py); the S3 case is in
tests/test_s3.py (an s3:// results root takes this path by default).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pytest
from test_faults import assert_exactly_once, assert_no_actors_left, free_session_ray, rows, write_manifest

from fleet.results import direct, prompt_stats, reader
from fleet.results.store import RunStore
from fleet.run import driver

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

ACTORS = ["--set", "run.write=actors"]


def test_auto_takes_the_direct_path_for_a_shared_store_only(tmp_path: Path) -> None:
    local = RunStore(tmp_path / "r")
    remote = RunStore("s3://bucket/r?endpoint_override=http://127.0.0.1:9")  # nothing is requested
    assert not direct.actors_write("auto", local, nodes=1)
    assert not direct.actors_write("auto", local, nodes=4)  # a local disk is not shared with the other nodes
    assert direct.actors_write("auto", remote, nodes=1)
    assert direct.actors_write("actors", local, nodes=1) and not direct.actors_write("driver", remote, nodes=1)
    assert direct.network_fs(local.root) is False  # this machine's temp directory is no network mount


@dataclass(frozen=True)
class DyingSink(direct.DirectSink):
    """A DirectSink whose reference actor is SIGKILLed once, scoring candidate shard `victim`,
    after it stored the scored shard's files and before its answer reaches the driver; it records
    the files it left in `marker`."""

    victim: str = ""
    marker: str = ""

    def scored(self, stored: tuple[str, str], score: Callable[[pa.Table], pa.Table]) -> direct.Written:
        written = super().scored(stored, score)
        if stored[0] == self.victim and not Path(self.marker).exists():
            staging = Path(self.run_dir) / ".staging"
            Path(self.marker).write_text(json.dumps(sorted(str(p) for p in staging.glob("**/*.parquet"))))
            os.kill(os.getpid(), signal.SIGKILL)
        return written


def test_killed_driver_and_killed_actor_leave_every_shard_exactly_once(
    local_ray: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleet run` writing from the actors is SIGKILLed between commits; `--resume` then runs with
    an actor that is SIGKILLed after storing a shard, before its commit: the shard is retried, and
    every shard ends up in the tables once, nothing left staged."""
    import ray.cloudpickle

    manifest = write_manifest(tmp_path, cand=", seconds_per_token: 0.04", prompts=8)
    run_dir = tmp_path / "results" / "cut"
    cmd = [sys.executable, "-m", "fleet", "run", str(manifest), "--results", str(run_dir.parent), "--run-id", "cut"]
    env = os.environ | {"RAY_ADDRESS": free_session_ray(local_ray)}
    proc = subprocess.Popen([*cmd, *ACTORS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        while proc.poll() is None and len(list((run_dir / "shards").glob("**/*.parquet"))) < 4:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    committed = set(reader.load(run_dir)["shards"].collect()["shard_id"])
    assert 4 <= len(committed) < 16 and json.loads((run_dir / "run.json").read_text())["status"] == "running"
    before = {p: p.stat().st_mtime_ns for p in (run_dir / "shards").glob("**/*.parquet")}

    # The victim: a candidate shard not committed yet, which the reference scores on resume.
    victim = next(f"m{m}/cand/p/{i:05d}" for m in (2, 1) for i in range(4) if f"m{m}/cand/p/{i:05d}" not in committed)
    marker = tmp_path / "killed"
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import tests/

    def dying(manifest: Any, store: RunStore) -> DyingSink:
        return DyingSink(store.root, store.run_id, manifest.reference, victim=victim, marker=str(marker))

    monkeypatch.setattr(driver, "_sink", dying)
    _, outcome = driver.resume(run_dir, progress=False)
    left = json.loads(marker.read_text())  # the actor did die, with the shard's files stored
    model = victim.split("/")[0]
    assert [f for f in left if f"/.staging/ready/tokens/model={model}/" in f and "/target=cand/" in f]
    assert outcome.retries >= 1 and not outcome.partial
    assert_exactly_once(run_dir, prompts=8)
    assert all(p.stat().st_mtime_ns == mtime for p, mtime in before.items())  # committed shards untouched
    assert not (run_dir / ".staging").exists() and not [f for f in left if Path(f).exists()]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "complete" and info["write"] == "actors"
    assert_no_actors_left()


def test_the_direct_path_stores_what_the_driver_path_stores(local_ray: Any, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path)
    out = {}
    for write in ("driver", "actors"):
        run_dir, outcome = driver.run(
            manifest, results_dir=tmp_path / "r", run_id=write, progress=False, overrides=[f"run.write={write}"]
        )
        assert not outcome.partial and json.loads((run_dir / "run.json").read_text())["write"] == write
        out[write] = rows(run_dir)
    for table in ("requests", "tokens", "prompt_stats"):
        keys = ["model", "target", "prompt_id", *(["position"] if table == "tokens" else [])]
        a, b = (out[w][table].drop("run_id").sort(keys) for w in ("driver", "actors"))
        assert a.equals(b), table
    drop = ["run_id", "started_at", "wall_s", "hostname"]
    assert (
        out["driver"]["shards"].drop(drop).sort("shard_id").equals(out["actors"]["shards"].drop(drop).sort("shard_id"))
    )


def _reference_rule(k: int) -> pl.Expr:
    """The tie rule as sets, as fleet/analysis/ties.py states it: the candidate's token and its
    tied maxima, intersected with the reference's tied maxima (the definition before slots)."""
    lp, ref_lp = pl.col("topk_logprobs"), pl.col("ref_topk_logprobs")
    cand_max, ref_max = pl.max_horizontal(pl.col("logprob"), lp.list.max()), ref_lp.list.max()

    def tied(ids: str, logprobs: pl.Expr, top: pl.Expr) -> list[pl.Expr]:
        get = [(pl.col(ids).list.get(j, null_on_oob=True), logprobs.list.get(j, null_on_oob=True)) for j in range(k)]
        return [pl.when(v >= top).then(i.cast(pl.Int64)) for i, v in get]

    cand = pl.concat_list(pl.col("token_id").cast(pl.Int64), *tied("topk_ids", lp, cand_max)).list.drop_nulls()
    ref = pl.concat_list(
        pl.when(pl.col("ref_logprob") >= ref_max).then(pl.col("token_id").cast(pl.Int64)),
        *tied("ref_topk_ids", ref_lp, ref_max),
    ).list.drop_nulls()
    return pl.when(ref_lp.list.len() > 0).then(cand.list.set_intersection(ref).list.len() > 0)


def test_the_tie_rule_over_slot_columns_is_the_set_rule() -> None:
    """Many ties (ids and logprobs drawn from a few values), ragged and missing top-k lists."""
    rng, n, k = np.random.default_rng(7), 20_000, 5

    def ragged(values: Any) -> list[list[Any] | None]:
        return [None if m < 0 else v[:m].tolist() for v, m in zip(values, rng.integers(-1, k + 1, n), strict=True)]

    frame = pl.DataFrame(
        {
            "token_id": rng.integers(0, 6, n).astype(np.int32),
            "logprob": -rng.integers(0, 3, n).astype(np.float32),
            "ref_logprob": [None if x < 0.1 else -float(rng.integers(0, 3)) for x in rng.random(n)],
            "topk_ids": ragged(rng.integers(0, 6, (n, k))),
            "topk_logprobs": ragged(-rng.integers(0, 3, (n, k)).astype(float)),
            "ref_topk_ids": ragged(rng.integers(0, 6, (n, k))),
            "ref_topk_logprobs": ragged(-rng.integers(0, 3, (n, k)).astype(float)),
        }
    )
    expected = frame.select(x=_reference_rule(k))["x"]
    assert expected.null_count() and expected.sum() and (~expected.drop_nulls()).sum()  # all three outcomes
    slots = frame.with_columns(**prompt_stats.topk_slots(k))
    for got in (
        frame.select(x=prompt_stats.top1_agreement(k))["x"],
        slots.select(x=prompt_stats.top1_agreement(k, materialized=True))["x"],
    ):
        assert got.is_null().equals(expected.is_null()) and got.fill_null(False).equals(expected.fill_null(False))
    kl = frame.select(x=prompt_stats.kl(k))["x"]
    assert slots.select(x=prompt_stats.kl(k, materialized=True))["x"].equals(kl, null_equal=True)
