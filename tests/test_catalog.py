"""Result sets any engine reads: a run read by DuckDB's Hive reader gives the report's parity
aggregates; a results root lists its runs and answers one SQL query over all of them."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from test_compare import DIVERGED, SAME, write_run

from fleet import cli
from fleet.analysis import query
from fleet.contracts.errors import UserError
from fleet.report.model import RunReport
from fleet.results import catalog

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
