"""Parity under load through the scheduler, on test_scheduler's fake Ray (in-process, no engine):
each level's parity rows go to the reference to be scored like a candidate shard, then are written
with the level's perf rows, its perf_levels row last; the same when the targets take turns with
the reference, and unscored (the level still done) when no reference is left to score them.
The real engines run it in tests/test_load_parity.py and tests/test_server.py."""

# ruff: noqa: F811  (the tests take test_scheduler's `cluster` fixture, imported below, as a parameter)
from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from test_scheduler import MANIFEST, Cluster, cluster, run, tables  # noqa: F401

from fleet.contracts.errors import UserError
from fleet.run.manifest_file import load as load_manifest

WITH_PARITY = MANIFEST.replace(
    "num_requests: 2}", "num_requests: 2, parity: {prompt_set: p}}"
)  # levels 1 and 2 on vl and ep, 3 prompts each
APART = WITH_PARITY.replace("{name: vl, kind: vllm}", "{name: vl, kind: vllm, num_cpus: 5.5}")


def _levels(t: dict[str, pl.DataFrame]) -> list[tuple[str, str, int]]:
    return sorted(t["perf_levels"].select("model", "target", "level").rows())


@pytest.mark.parametrize("manifest", [WITH_PARITY, APART], ids=["together", "taking-turns"])
def test_each_level_is_scored_by_the_reference_then_written_once(
    cluster: Cluster, tmp_path: Path, manifest: str
) -> None:
    run_dir, outcome, info = run(tmp_path, manifest)
    assert info["status"] == "complete" and not outcome.partial
    t = tables(run_dir)
    req, tok = t["load_requests"], t["load_tokens"]
    expected = [(m, tg, lv) for m in ("m1", "m2") for tg in ("ep", "vl") for lv in (1, 2)]
    assert _levels(t) == expected
    per_level = req.group_by("model", "target", "level", "phase").len()
    assert per_level.height == len(expected) * 2 and (per_level["len"] == 3).all()
    assert tok.height > 0 and tok["ref_logprob"].null_count() == 0  # every row scored by the reference
    assert set(tok["prompt_id"]) == {"a", "b", "c"}  # the reference's private keys are undone
    # The reference was asked once per level, with the precision twin, like a candidate shard.
    scored = [e for e in cluster.log if e[0] == "send" and e[3] == "score" and e[2] == "ref"]
    assert len(scored) == 2 * 2 * 2 + len(expected)  # 2 models x 2 candidates x 2 shards, + the levels
    levels = sorted((e[1], e[4]) for e in scored if e[4].startswith("s/"))
    assert levels == sorted((m, f"s/{lv}") for m, _, lv in expected)


def test_without_a_reference_left_the_rows_are_written_unscored(cluster: Cluster, tmp_path: Path) -> None:
    cluster.fail[("m1", "ref", "describe")] = 9  # the reference never starts
    run_dir, outcome, _ = run(tmp_path, WITH_PARITY)
    t = tables(run_dir)
    m1 = t["load_tokens"].filter(pl.col("model") == "m1")
    assert m1.height > 0 and m1["ref_logprob"].null_count() == m1.height
    assert [lv for lv in _levels(t) if lv[0] == "m1"] == [("m1", tg, lv) for tg in ("ep", "vl") for lv in (1, 2)]
    assert "m1/ref" in outcome.failures


def test_a_parity_prompt_set_must_exist(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MANIFEST.replace("num_requests: 2}", "num_requests: 2, parity: {prompt_set: nope}}"))
    with pytest.raises(UserError, match=r"perf\[0\].parity.prompt_set: no prompt set 'nope'; sets: p"):
        load_manifest(path)
    path.write_text(MANIFEST.replace("num_requests: 2}", "num_requests: 2, parity: {prompt_set: p, at: 1}}"))
    with pytest.raises(UserError, match=r"perf\[0\]\.parity\.at: Input should be less than 1"):
        load_manifest(path)
