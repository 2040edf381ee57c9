"""fleet.query: SQL over a hand-made run directory, including the three examples in docs/recipes.md."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from test_compare import DIVERGED, write_run

from fleet.analysis import query
from fleet.contracts import stored_tables
from fleet.contracts.errors import UserError


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run_dir = write_run(tmp_path / "run", {"cand": DIVERGED}, wall_s={"cand": 0.5})
    # A table the query module has never heard of: registered by its directory name.
    (run_dir / "custom" / "m").mkdir(parents=True)
    pl.DataFrame({"model": ["m"], "target": ["cand"], "layer": [0], "rel_l2": [0.01]}).write_parquet(
        run_dir / "custom" / "m" / "cand.parquet"
    )
    return run_dir


def test_tables_by_name(run: Path) -> None:
    assert set(query.tables(run)) == set(stored_tables.all_tables()) | {"custom"}
    counts = query.query(run, "SELECT target, COUNT(*) AS n FROM tokens GROUP BY target ORDER BY target")
    assert counts.rows() == [("cand", 6), ("ref", 6)]
    assert query.query(run, "SELECT rel_l2 FROM custom").item() == 0.01


def test_derived_tables_only_when_named(run: Path) -> None:
    assert "parity" not in query.context(run, sql="SELECT * FROM tokens").tables()
    parity = query.query(run, "SELECT target, seq_match_rate, tokens_matched FROM parity")
    assert parity.rows() == [("cand", 0.5, 5)]  # p2 diverges at position 1; positions 0 and 2 match


def test_empty_run_is_queryable(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"reference": "ref"}))
    assert query.query(tmp_path, "SELECT COUNT(*) AS n FROM tokens").item() == 0


def test_errors_name_the_tables_in_two_lines(run: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"query failed: .*SELEC.*\ntables: .*\btokens\b.*--tables\)$") as e:
        query.query(run, "SELEC 1")
    assert len(str(e.value).splitlines()) == 2
    # A wrong column: the table's own columns, whole (Polars' list was cut at 200 characters).
    with pytest.raises(UserError, match=r"query failed: unknown column 'nosuch' \(known columns: .*\btoken_id\b"):
        query.query(run, "SELECT nosuch FROM tokens")
    with pytest.raises(UserError, match="no such run directory"):
        query.query(tmp_path / "missing", "SELECT 1")


def test_the_documented_examples(run: Path) -> None:
    worst = query.query(run, query.EXAMPLES["worst teacher-forced positions"])
    # |logprob - ref_logprob| on the candidate's rows: p2 position 1 is |-0.75 - -1.5| = 0.75, the largest.
    assert (worst["prompt_id"][0], worst["position"][0], worst["abs_dlogp"][0]) == ("p2", 1, 0.75)
    assert worst.height == 6  # only candidate rows carry a reference logprob
    diverge = query.query(run, query.EXAMPLES["where each prompt diverges"])
    assert diverge.select("prompt_id", "first_divergence", "cand_token", "ref_top1").rows() == [("p2", 1, 3, 3)]
    latency = query.query(run, query.EXAMPLES["latency by target"])
    # ttft 0.01 and 0.02 s per target: median 15 ms; tpot 5 ms.
    assert latency["requests"].to_list() == [2, 2]
    assert latency["ttft_p50_ms"].to_list() == pytest.approx([15.0, 15.0])
    assert latency["tpot_p50_ms"].to_list() == pytest.approx([5.0, 5.0])


def test_render_formats(run: Path) -> None:
    frame = query.query(run, "SELECT prompt_id, topk_ids FROM tokens WHERE target = 'cand' AND position = 0")
    assert query.render(frame, fmt="csv") == "prompt_id,topk_ids\np1,[5]\np2,[5]\n"
    assert query.render(frame, fmt="json").splitlines()[0] == '{"prompt_id":"p1","topk_ids":[5]}'
    assert "p1" in query.render(frame)
    with pytest.raises(ValueError, match="unknown format"):
        query.render(frame, fmt="xml")
