"""Targets that do not fit beside the reference take turns with it (issue 23, item 5): candidates
generate with the reference down, their shards staged (fleet/results/staging.py); then the
reference generates its own shards and scores every staged one, exactly once, also across a
killed driver and `--resume`.

Most of it runs on the fake Ray of test_scheduler.py (in-process, deterministic, a fraction of a
second); the kill test runs the real thing: `fleet run` on the session's Ray, SIGKILLed between
a candidate's generation and the reference's scoring, then resumed.
"""

# ruff: noqa: F811  (the tests take test_scheduler's `cluster` fixture, imported below, as a parameter)
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from test_faults import assert_exactly_once, assert_no_actors_left, free_session_ray, write_manifest
from test_scheduler import (  # noqa: F401  (cluster: the fake-Ray fixture, one definition)
    MANIFEST,
    MODELS,
    SHARDS_PER_TARGET,
    Cluster,
    DriverKilled,
    _row,
    cluster,
    run,
    tables,
)

from fleet.analysis import query
from fleet.contracts.engine import Generation
from fleet.results import reader
from fleet.results.staging import Staging
from fleet.results.store import RunStore
from fleet.run import driver
from fleet.run.placement import check_fits, reservation, takes_turns

# vl holds 5.5 of the fake cluster's 6 CPUs: it cannot run beside the reference's 1.
APART = MANIFEST.replace("{name: vl, kind: vllm}", "{name: vl, kind: vllm, num_cpus: 5.5}")
CANDIDATES = ("vl", "ep")


def up_together(cluster: Cluster) -> set[tuple[str, ...]]:
    """(model, target, target) of actors that were up at once: from an actor's describe to its shutdown."""
    up: dict[str, set[str]] = {}
    together = set()
    for kind, model, target, method, *_ in cluster.log:
        if kind != "send" or method not in ("describe", "shutdown"):
            continue
        if method == "shutdown":
            up[model].discard(target)
            continue
        together |= {(model, *sorted((target, other))) for other in up.setdefault(model, set())}
        up[model].add(target)
    return together


def comparable(run_dir: Path) -> dict[str, pl.DataFrame]:
    """The parity rows as a reader sees them, without what differs between any two runs (run id, clock)."""
    t = tables(run_dir)
    keys = ["model", "target", "prompt_id"]
    return {
        "requests": t["requests"].drop("run_id").sort(keys),
        "tokens": t["tokens"].drop("run_id").sort([*keys, "position"]),
        "shards": t["shards"].drop("run_id", "started_at", "wall_s").sort("shard_id"),
    }


def test_the_check_takes_turns_and_refuses_only_a_target_that_fits_nowhere(tmp_path: Path) -> None:
    from fleet.run.manifest_file import load

    path = tmp_path / "m.yaml"
    path.write_text(APART)
    m = load(path)
    assert not takes_turns(m, {"CPU": 7.0}) and reservation(m, {"CPU": 7.0}) == {"CPU": 6.5}  # ref + vl
    assert takes_turns(m, {"CPU": 6.0}) and reservation(m, {"CPU": 6.0}) == {"CPU": 5.5}  # vl alone
    check_fits(m, {"CPU": 6.0}, [{"CPU": 6.0}])
    with pytest.raises(RuntimeError, match=r"target 'vl' alone needs \{'CPU': 5.5\}; the cluster has \{'CPU': 5.0\}"):
        check_fits(m, {"CPU": 5.0})


def generation(shard_id: str, tokens: int) -> Generation:
    """A candidate shard of one prompt with `tokens` token rows."""
    model, target, prompt_set, _ = shard_id.split("/")
    keys = {"model": model, "model_weights": "w", "target": target, "prompt_set": prompt_set, "shard_id": shard_id}
    rows = pa.concat_tables([_row("tokens", **keys, prompt_id="a", position=i) for i in range(max(tokens, 1))])
    return Generation(_row("requests", **keys, prompt_id="a"), rows.slice(0, tokens), _row("shards", **keys))


def test_staging_keeps_whole_shards_and_resume_removes_the_rest(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run", {"run_id": "run", "reference": "ref"})
    staging = Staging(store)
    whole, empty, cut, committed = (f"m/c/p/{i:05d}" for i in range(4))
    assert staging.put(generation(whole, 3)) == "w"
    staging.put(generation(empty, 0))  # no token rows: its tokens file is stored under weights "none"
    staging.put(generation(committed, 1))
    store.write("requests", cut, generation(cut, 1).requests, staged=True)  # killed while staging it
    (tmp_path / "run" / ".staging" / ".requests.parquet.tmp").write_bytes(b"half a file")
    got = staging.get(whole, "w")
    assert (got.requests.num_rows, got.tokens.num_rows, got.shard.column("shard_id")[0].as_py()) == (1, 3, whole)
    assert staging.get(empty, "w").tokens.num_rows == 0
    assert {name: frame.collect().height for name, frame in reader.load(tmp_path / "run").items()}["tokens"] == 0
    assert not [name for name in query.tables(tmp_path / "run") if "stag" in name]

    # Resume: `committed` has its shards row; `cut` was never whole.
    assert staging.recover({whole, empty, cut}) == {whole: "w", empty: "w"}
    left = sorted(p.name for p in (tmp_path / "run" / ".staging").glob("**/*") if p.is_file())
    assert left == ["p-00000.parquet"] * 3 + ["p-00001.parquet"] * 3
    staging.drop(whole, "w")
    staging.drop(empty, "w")
    staging.tidy()
    assert not (tmp_path / "run" / ".staging").exists()


def test_targets_that_cannot_share_the_cluster_take_turns_with_the_same_rows(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet.run.progress import Progress

    (tmp_path / "turns").mkdir()
    (tmp_path / "together").mkdir()
    told: list[tuple[str, int]] = []  # what the progress line was told waits for the reference's turn
    original = Progress.staged
    monkeypatch.setattr(Progress, "staged", lambda bar, model, n: (told.append((model, n)), original(bar, model, n))[1])
    run_dir, outcome, info = run(tmp_path / "turns", APART)
    for model in ("m1", "m2"):  # every candidate shard (2 targets x 2) waited, and none is left waiting
        counts = [n for m, n in told if m == model]
        assert max(counts) == len(CANDIDATES) * 2 and counts[-1] == 0, counts
    assert info["status"] == "complete" and not outcome.partial
    assert "taking turns: ref + vl need {'CPU': 6.5} at once, the cluster has {'CPU': 6.0};" in capsys.readouterr().err
    # The reference never held its CPUs beside a candidate.
    assert {pair for pair in up_together(cluster) if "ref" in pair} == set()
    # Candidates generated first, then the reference generated and scored every staged shard once.
    for model in ("m1", "m2"):
        sent = [(e[2], e[3]) for e in cluster.log if e[0] == "send" and e[1] == model]
        last_candidate_shard = max(i for i, (t, m) in enumerate(sent) if t != "ref" and m == "generate")
        assert min(i for i, (t, m) in enumerate(sent) if t == "ref") > last_candidate_shard
    scored = sorted(e[4] for e in cluster.log if e[0] == "send" and e[3] == "score")
    assert scored == sorted(f"{m}/{c}/p/{i:05d}" for m in ("m1", "m2") for c in CANDIDATES for i in range(2))
    assert not (run_dir / ".staging").exists()  # every staged shard committed, then removed
    # The same rows, ids and scores as when everything fits at once.
    together, _, _ = run(tmp_path / "together", MANIFEST)
    for name, frame in comparable(run_dir).items():
        assert frame.equals(comparable(together)[name]), name
    assert tables(run_dir)["perf_levels"].height == tables(together)["perf_levels"].height


AFTER = """
models: [{name: m1, source: {kind: synthetic, seed: 1}}]
prompts: {p: [{id: a, prompt: "one"}, {id: b, prompt: "two"}, {id: c, prompt: "three"}]}
targets:
  - {name: ref, kind: hf}
  - {name: vl, kind: vllm, num_cpus: 5.5}
  - {name: ep, kind: endpoint, base_url: "http://127.0.0.1:9/v1", after: vl}
reference: ref
sampling: {max_tokens: 3, logprobs: 2}
run: {shard_size: 2}
"""


def test_after_waits_for_the_reference_turn_that_scores_what_it_follows(cluster: Cluster, tmp_path: Path) -> None:
    asked: list[tuple[str, int, int]] = []

    def gates_of(run_dir: str | Path, model: str, target: str) -> str | None:
        tokens = reader.load(run_dir)["tokens"].collect().filter(pl.col("target") == target)
        asked.append((target, tokens.height, tokens["ref_logprob"].null_count()))
        return None

    path = tmp_path / "m.yaml"
    path.write_text(AFTER)
    run_dir, outcome = driver.run(path, results_dir=tmp_path / "r", run_id="r", progress=False, gates_of=gates_of)
    assert not outcome.partial and asked == [("vl", 3 * 3, 0)]  # vl's rows were all there, scored
    turns = [e[2] for e in cluster.log if e[0] == "send" and e[3] == "describe"]
    assert turns == ["vl", "ref", "ep", "ref"]  # the reference's second turn scores ep
    assert tables(Path(run_dir))["tokens"].filter(pl.col("target") != "ref")["ref_logprob"].null_count() == 0


def test_a_reference_that_cannot_start_leaves_the_staged_rows_unscored_once(cluster: Cluster, tmp_path: Path) -> None:
    # Twice: its first start is in a candidate's kept actor, which is given one new actor (idle_actors.py).
    cluster.fail = {("m1", "ref", "describe"): 2}
    run_dir, _, info = run(tmp_path, APART)
    assert set(info["failures"]) == {"m1/ref"}
    m1 = tables(run_dir)["tokens"].filter(pl.col("model") == "m1")
    assert set(m1["target"]) == set(CANDIDATES) and m1["ref_logprob"].null_count() == m1.height
    assert m1.select("target", "prompt_id", "position").is_duplicated().sum() == 0
    unscored = {s for s, why in info["failed_shards"].items() if why.startswith("unscored: target failed")}
    assert unscored == {f"m1/{c}/p/{i:05d}" for c in CANDIDATES for i in range(SHARDS_PER_TARGET)}
    assert not (run_dir / ".staging").exists()


def staged_shards(run_dir: Path) -> dict[str, Any]:
    """Whole staged shards (id -> started_at), as the staging area holds them."""
    files = sorted(str(p) for p in (run_dir / ".staging" / "shards").glob("**/*.parquet"))
    if not files:
        return {}
    rows = ds.dataset(files, format="parquet").to_table(columns=["shard_id", "started_at"]).to_pylist()
    return {r["shard_id"]: r["started_at"] for r in rows}


def test_a_driver_killed_before_the_reference_scores_resumes_exactly_once(cluster: Cluster, tmp_path: Path) -> None:
    cluster.kill_at = ("m1", "ref", "describe")  # m1's candidates have generated: its reference's turn
    with pytest.raises(DriverKilled):
        run(tmp_path, APART)
    run_dir = tmp_path / "results" / "r"
    staged = staged_shards(run_dir)
    assert set(staged) == {f"m1/{c}/p/{i:05d}" for c in CANDIDATES for i in range(SHARDS_PER_TARGET)}
    # Staged rows are no rows to a reader: not in the tables, not a table of `fleet query`.
    assert not set(staged) & set(tables(run_dir)["shards"]["shard_id"])
    assert tables(run_dir)["tokens"].filter(pl.col("target") != "ref").height == 0
    assert not [name for name in query.tables(run_dir) if "stag" in name]

    cluster.log.clear()
    cluster.kill_at = None
    _, outcome = driver.resume(run_dir, progress=False)
    assert not outcome.partial
    generated = {e[4] for e in cluster.log if e[0] == "send" and e[3] == "generate" and e[1] == "m1"}
    assert generated == {f"m1/ref/p/{i:05d}" for i in range(SHARDS_PER_TARGET)}  # staged shards only scored
    t = tables(run_dir)
    assert t["shards"].height == MODELS * 3 * SHARDS_PER_TARGET
    assert t["tokens"].select("model", "target", "prompt_id", "position").is_duplicated().sum() == 0
    assert t["tokens"].filter(pl.col("target") != "ref")["ref_logprob"].null_count() == 0
    assert not (run_dir / ".staging").exists()


def test_fleet_run_killed_between_generation_and_scoring_resumes_exactly_once(local_ray: Any, tmp_path: Path) -> None:
    """The real thing: `fleet run` on a 2-CPU Ray, where the reference (1 CPU) and the candidate
    (1.75) cannot run at once, SIGKILLed once m1's candidate has staged a shard and before its
    reference scores it; then resumed: staged shards are scored, not generated again."""
    manifest = write_manifest(tmp_path, cand=", seconds_per_token: 0.05")
    manifest.write_text(manifest.read_text().replace("0.5, logprob_shift", "1.75, logprob_shift"))
    run_dir, log = tmp_path / "results" / "cut", tmp_path / "stderr"
    cmd = [sys.executable, "-m", "fleet", "run", str(manifest), "--results", str(run_dir.parent), "--run-id", "cut"]
    env = os.environ | {"RAY_ADDRESS": free_session_ray(local_ray)}
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        # Each candidate shard sleeps 0.8 s, and m1's reference starts only after its third: the
        # first staged shard is the moment to kill (polled; no timing is asserted).
        while proc.poll() is None and not staged_shards(run_dir):
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert "taking turns: ref + cand need" in log.read_text()
    staged = staged_shards(run_dir)
    committed = set(reader.load(run_dir)["shards"].collect()["shard_id"])
    waiting = set(staged) - committed
    assert waiting and all(s.startswith("m1/cand/") for s in waiting), log.read_text()[-2000:]  # not yet scored
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"

    _, outcome = driver.resume(run_dir, progress=False)
    assert not outcome.partial
    assert_exactly_once(run_dir)
    shards = reader.load(run_dir)["shards"].collect()
    started = dict(zip(shards["shard_id"], shards["started_at"], strict=True))
    assert {s: started[s] for s in waiting} == {s: staged[s] for s in waiting}  # scored from the stored rows
    assert not (run_dir / ".staging").exists()
    assert_no_actors_left()
