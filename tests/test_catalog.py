"""Result sets any engine reads: a run read by DuckDB's Hive reader gives the report's parity
aggregates; a results root lists its runs and answers one SQL query over all of them, from its
catalog (fleet/results/catalog_files.py) and not by reading every run.json, yet finds the runs the
catalog lacks or has wrong."""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_compare import DIVERGED, SAME, write_run

from fleet import cli
from fleet.analysis import query
from fleet.contracts.errors import UserError
from fleet.report.model import RunReport
from fleet.results import catalog, catalog_files
from fleet.results.store import RunStore

# The analyst's DuckDB recipe (docs/recipes.md): Hive partitions as strings, stacked on run_id.
DUCKDB_PARITY = """
WITH t AS (
    SELECT * FROM read_parquet('{root}/tokens/**/*.parquet', hive_partitioning = true,
                               hive_types = {{'model': VARCHAR, 'model_weights': VARCHAR, 'target': VARCHAR}})
), cand AS (SELECT * FROM t WHERE target <> 'ref'), ref AS (SELECT * FROM t WHERE target = 'ref')
SELECT cand.model, cand.target,
       SUM(CASE WHEN cand.token_id = ref.token_id THEN 1 ELSE 0 END) AS same_token_positions,
       MAX(ABS(CAST(cand.logprob AS DOUBLE) - CAST(cand.ref_logprob AS DOUBLE))) AS tf_max_abs_logprob_diff,
       AVG(ABS(CAST(cand.logprob AS DOUBLE) - CAST(cand.ref_logprob AS DOUBLE))) AS tf_mean_abs_logprob_diff,
       AVG(CASE WHEN cand.token_id = cand.ref_topk_ids[1] THEN 1.0 ELSE 0.0 END) AS tf_top1_agreement,
       COUNT(DISTINCT cand.prompt_id) AS n_prompts
FROM cand JOIN ref USING (model, prompt_set, prompt_id, position)
GROUP BY ALL ORDER BY cand.target
"""


def test_duckdb_reads_a_run_and_agrees_with_the_report(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r1", {"cand": DIVERGED, "cand2": SAME})
    got = duckdb.sql(DUCKDB_PARITY.format(root=run)).pl()
    report = RunReport.build(run, gates=[]).parity.sort("target")
    assert got["target"].to_list() == report["target"].to_list() == ["cand", "cand2"]
    for col in ("tf_max_abs_logprob_diff", "tf_mean_abs_logprob_diff", "tf_top1_agreement", "n_prompts"):
        assert got[col].to_list() == pytest.approx(report[col].to_list()), col
    # Hive partition directories and the run_id column, as every file carries them.
    hive = duckdb.sql(
        f"SELECT DISTINCT run_id, model, model_weights, target FROM read_parquet('{run}/requests/**/*.parquet', "
        "hive_partitioning = true) ORDER BY target"
    ).fetchall()
    assert hive == [("r1", "m", "0123456789abcdef", t) for t in ("cand", "cand2", "ref")]


def test_the_readmes_duckdb_statement_reads_every_run_of_a_root(tmp_path: Path) -> None:
    """The one-liner the README shows, as written there, over a root of two runs: every run's
    token rows, by run and target, as many as each run's tokens table holds."""
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    line = next(s for s in readme.splitlines() if s.strip().startswith('duckdb -c "'))
    sql = line.strip().removeprefix('duckdb -c "').removesuffix('"')
    root = tmp_path / "results"
    write_run(root / "a", {"cand": SAME})
    write_run(root / "b", {"cand": DIVERGED, "cand2": SAME})
    with pytest.MonkeyPatch.context() as env:
        env.chdir(tmp_path)  # the statement names results/ where the reader stands
        got = sorted(duckdb.sql(sql).fetchall())
    expect = sorted(
        (run, target, n)
        for run in "ab"
        for target, n in query.query(root / run, "SELECT target, count(*) FROM tokens GROUP BY target").rows()
    )
    assert got == expect and {run for run, _, _ in got} == {"a", "b"}


def test_a_results_root_lists_runs_and_answers_one_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "results"
    write_run(root / "a", {"cand": SAME})
    write_run(root / "b", {"cand": DIVERGED, "cand2": SAME})
    (root / "not-a-run").mkdir()
    runs = catalog.runs(root)
    assert runs["run_id"].to_list() == ["a", "b"] and runs["status"].to_list() == ["complete"] * 2
    assert runs["targets"].to_list() == ["ref, cand", "ref, cand, cand2"]
    # TF max |dlogp| of every target of model m over the last 2 runs: one query across runs.
    sql = (
        "SELECT run_id, target, MAX(ABS(logprob - ref_logprob)) AS tf_max FROM tokens "
        "WHERE model = 'm' AND target <> 'ref' "
        "AND run_id IN (SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 2) "
        "GROUP BY run_id, target ORDER BY run_id, target"
    )
    got = query.query(root, sql)
    assert got.select("run_id", "target").rows() == [("a", "cand"), ("b", "cand"), ("b", "cand2")]
    per_run = {
        r: query.query(root / r, "SELECT MAX(ABS(logprob - ref_logprob)) FROM tokens WHERE target = 'cand'").item()
        for r in "ab"
    }
    assert got.filter(target="cand")["tf_max"].to_list() == pytest.approx([per_run["a"], per_run["b"]])
    # Computed tables are stacked per run too.
    parity = query.query(root, "SELECT run_id, target, seq_match_rate FROM parity ORDER BY run_id, target")
    assert parity.rows() == [("a", "cand", 1.0), ("b", "cand", 0.5), ("b", "cand2", 1.0)]
    assert cli.main(["runs", str(root)]) == 0
    assert "complete" in capsys.readouterr().out


def test_report_takes_a_run_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "results"
    write_run(root / "a", {"cand": SAME})
    assert cli.main(["report", "a", "--results", str(root)]) == 0
    assert "Parity" in capsys.readouterr().out
    assert cli.main(["report", "nope", "--results", str(root)]) == 2
    assert "not a run directory, nor a run id under" in capsys.readouterr().err
    with pytest.raises(UserError, match="no such results directory"):
        catalog.runs(tmp_path / "nowhere")


def test_schema_2_runs_read_with_run_id_and_refuse_resume(tmp_path: Path) -> None:
    """A run written before the Hive layout (schema 2: no run_id, plain directory names) still reads."""
    import pyarrow.parquet as pq

    from fleet.results import reader
    from fleet.run import driver

    run = write_run(tmp_path / "old", {"cand": SAME})
    for file in sorted(run.rglob("*.parquet")):
        table = pq.read_table(file).drop_columns(["run_id"])
        table = table.replace_schema_metadata({**table.schema.metadata, b"fleet.schema_version": b"2"})
        parts = file.relative_to(run).parts  # <table>/model=m/model_weights=w/target=t/<file>
        old = run.joinpath(parts[0], *(p.split("=", 1)[1] for p in parts[1:-1]), parts[-1])
        old.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, old)
        file.unlink()
    catalog.record_verdict(run, "PASS")
    store_info = reader.read_info(run).stored | {"schema_version": 2}
    (run / "run.json").write_text(json.dumps(store_info))
    requests = reader.load(run)["requests"].collect()
    assert requests["run_id"].unique().to_list() == ["old"] and requests.height == 4
    assert RunReport.build(run, gates=[]).parity["target"].to_list() == ["cand"]
    assert catalog.runs(tmp_path)["gates"].to_list() == ["PASS"]
    with pytest.raises(UserError, match=r"written with schema version 2; .* cannot add to it"):
        driver.resume(run)


# --- the catalog: `fleet runs` and `fleet query ROOT` without opening every run.json ---------------


def _forbid_reading_run_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reader of run.json goes through RunStore.info: make it fail."""

    def refuse(self: RunStore) -> dict[str, Any]:
        raise AssertionError(f"read {self.run_dir}/run.json")

    monkeypatch.setattr(RunStore, "info", refuse)


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run directories whose run.json is read from now on."""
    read: list[str] = []
    original = RunStore.info

    def counted(self: RunStore) -> dict[str, Any]:
        read.append(Path(str(self.run_dir)).name)
        return original(self)

    monkeypatch.setattr(RunStore, "info", counted)
    return read


def test_runs_and_query_come_from_the_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "results"
    write_run(root / "a", {"cand": SAME})
    write_run(root / "b", {"cand": DIVERGED, "cand2": SAME})
    catalog.record_verdict(root / "b", "FAIL")
    # One entry per run, the older ones of each run (created, complete, verdict) gone.
    entries = sorted(p.name.split(".")[0] for p in (root / "_catalog" / "entries").iterdir())
    assert entries == ["a", "b"]
    expected = catalog.runs(root)  # writes runs.json: every row in one file
    assert (root / "_catalog" / "runs.json").is_file()
    assert expected["gates"].to_list() == ["not recorded", "FAIL"]

    _forbid_reading_run_json(monkeypatch)
    assert catalog.runs(root).equals(expected)
    (root / "_catalog" / "runs.json").unlink()  # from the entries alone, too
    assert catalog.runs(root).equals(expected)
    got = query.query(root, "SELECT run_id, target, COUNT(*) AS n FROM tokens GROUP BY ALL ORDER BY ALL")
    assert got.rows() == [("a", "cand", 6), ("a", "ref", 6), ("b", "cand", 6), ("b", "cand2", 6), ("b", "ref", 6)]
    assert query.query(root, "SELECT run_id, gates FROM runs ORDER BY run_id").rows() == [
        ("a", "not recorded"),
        ("b", "FAIL"),
    ]
    assert "run_json" not in catalog.runs(root).columns  # the listing shows no bookkeeping of the catalog


def test_a_run_copied_in_by_hand_is_found_and_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "results"
    write_run(root / "a", {"cand": SAME})
    write_run(tmp_path / "elsewhere" / "copied", {"cand": DIVERGED})
    catalog.runs(root)
    shutil.copytree(tmp_path / "elsewhere" / "copied", root / "copied")  # no entry comes with it
    (root / "empty-dir").mkdir()  # not a run: no run.json
    read = _count_reads(monkeypatch)
    assert catalog.runs(root)["run_id"].to_list() == ["a", "copied"]
    assert read == ["copied"]
    read.clear()
    assert catalog.runs(root)["run_id"].to_list() == ["a", "copied"]
    assert read == []  # its row was cached in runs.json
    # Its tables are stacked as well (it has no entry, but its row came from its run.json).
    tokens = query.query(root, "SELECT run_id, COUNT(*) AS n FROM tokens GROUP BY run_id ORDER BY run_id")
    assert tokens.rows() == [("a", 12), ("copied", 12)]


def test_a_stale_missing_or_damaged_catalog_is_read_around(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "results"
    for name in ("a", "b", "c"):
        write_run(root / name, {"cand": SAME})
    catalog.runs(root)
    read = _count_reads(monkeypatch)

    # run.json changed behind the catalog's back (by hand; or a writer killed before its entry).
    info = json.loads((root / "a" / "run.json").read_text()) | {"status": "interrupted"}
    (root / "a" / "run.json").write_text(json.dumps(info))
    assert catalog.runs(root).filter(run_id="a")["status"].item() == "interrupted"
    assert read == ["a"]

    # A damaged entry and a damaged runs.json: each run is still listed, from its run.json.
    read.clear()
    next((root / "_catalog" / "entries").glob("b.*.json")).write_text("{not json")
    (root / "_catalog" / "runs.json").write_text('{"format": 1, "rows": {"c": {"status": 7}}}')
    assert catalog.runs(root)["status"].to_list() == ["interrupted", "complete", "complete"]
    assert sorted(read) == ["a", "b"]  # c's entry is whole; a's stat no longer matches its entry

    # A run deleted, or left without its run.json: gone from the listing whatever its entry says.
    shutil.rmtree(root / "c")
    (root / "b" / "run.json").unlink()
    assert catalog.runs(root)["run_id"].to_list() == ["a"]

    # No catalog at all: every run.json is read, and the catalog's rows are cached again.
    write_run(root / "d", {"cand": SAME})
    shutil.rmtree(root / "_catalog")
    read.clear()
    assert catalog.runs(root)["run_id"].to_list() == ["a", "d"]
    assert sorted(read) == ["a", "d"] and (root / "_catalog" / "runs.json").is_file()
    read.clear()
    assert catalog.runs(root)["run_id"].to_list() == ["a", "d"] and read == []
    # A damaged run.json the catalog has no row for is still an error, as without a catalog.
    (root / "d" / "run.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        catalog.runs(root)


def test_concurrent_writers_lose_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs created, finished and given a verdict all at once into one root, while readers list it
    (and rewrite runs.json): every run is listed, with its last state, from the catalog."""
    root = tmp_path / "results"
    start = threading.Barrier(8)

    def write(i: int) -> None:
        start.wait()
        run = RunStore.create(root / f"r{i}", {"run_id": f"r{i}", "reference": "ref"})
        catalog.runs(root)
        run.update_info(status="complete", finished_at="now")
        catalog.record_verdict(root / f"r{i}", "PASS")
        catalog.runs(root)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8)))
    entries = sorted(p.name.split(".")[0] for p in (root / "_catalog" / "entries").iterdir())
    assert entries == [f"r{i}" for i in range(8)]  # one each: the older ones deleted
    (root / "_catalog" / "runs.json").unlink()
    _forbid_reading_run_json(monkeypatch)  # so the entries alone hold every run's last state
    listed = catalog.runs(root).sort("run_id")
    assert listed["run_id"].to_list() == [f"r{i}" for i in range(8)]
    assert set(listed["status"]) == {"complete"} and set(listed["gates"]) == {"PASS"}


def test_an_entry_written_on_a_host_whose_clock_is_behind_still_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "results"
    run = RunStore.create(root / "r", {"run_id": "r", "reference": "ref"})
    [first] = [p.name for p in (root / "_catalog" / "entries").iterdir()]
    monkeypatch.setattr(catalog_files.time, "time_ns", lambda: 1)  # a resume on another machine
    run.update_info(status="complete")
    [second] = [p.name for p in (root / "_catalog" / "entries").iterdir()]
    assert second.split(".")[1] > first.split(".")[1]  # names sort as their stamps: the newest wins
    with monkeypatch.context() as m:
        _forbid_reading_run_json(m)
        assert catalog.runs(root)["status"].to_list() == ["complete"]
