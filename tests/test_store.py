"""The run directory: atomic writes, the declared schema on disk, run.json bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet.contracts import schema
from fleet.results import store
from fleet.results.store import RunStore


def _requests(n: int) -> pa.Table:
    return pa.table(
        {
            "model": ["m"] * n,
            "model_weights": ["w"] * n,
            "target": ["t"] * n,
            "prompt_set": ["s"] * n,
            "prompt_id": [f"p{i}" for i in range(n)],
            "shard_id": ["m/t/s/00000"] * n,
            "n_output_tokens": list(range(n)),
        }
    )


def test_write_conforms_to_declared_schema(tmp_path: Path) -> None:
    run = RunStore.create(tmp_path / "run", {"run_id": "run"})
    path = run.write("requests", "m/t/s/00000", _requests(3))
    assert path == tmp_path / "run" / "requests" / "model=m" / "model_weights=w" / "target=t" / "s-00000.parquet"
    assert pq.read_table(path).column("run_id").to_pylist() == ["run"] * 3
    table = pq.read_table(path)
    assert table.schema.remove_metadata().equals(schema.REQUESTS.remove_metadata())
    assert table.column("n_output_tokens").type == pa.int32()
    assert table.column("ttft_s").null_count == 3  # absent nullable columns are written as nulls


def test_missing_required_column_is_refused(tmp_path: Path) -> None:
    run = RunStore.create(tmp_path / "run", {})
    with pytest.raises(ValueError, match="lacks required column 'prompt_id'"):
        run.write("requests", "m/t/s/00000", _requests(2).drop(["prompt_id"]))


def test_crash_mid_write_leaves_no_file_that_looks_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunStore.create(tmp_path / "run", {})

    def dies_halfway(table: pa.Table, where: Path, **kw: object) -> None:
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError("disk gone")

    monkeypatch.setattr(store.pq, "write_table", dies_halfway)
    with pytest.raises(OSError, match="disk gone"):
        run.write("requests", "m/t/s/00000", _requests(2))
    assert not run.shard_path("requests", "m/t/s/00000", "w").exists()
    assert list((tmp_path / "run").glob("**/*.parquet")) == []


def test_run_dir_is_never_reused(tmp_path: Path) -> None:
    RunStore.create(tmp_path / "run", {})
    with pytest.raises(FileExistsError):
        RunStore.create(tmp_path / "run", {})


def test_run_json_tracks_status(tmp_path: Path) -> None:
    run = RunStore.create(tmp_path / "run", {"run_id": "run"})
    assert run.info()["status"] == "running" and run.info()["schema_version"] == schema.SCHEMA_VERSION
    run.update_info(status="complete")
    assert run.info()["status"] == "complete" and run.info()["run_id"] == "run"
    assert not list((tmp_path / "run").glob(".*.tmp"))


def test_the_docs_document_every_column() -> None:
    page = (Path(__file__).parents[1] / schema.TABLES_PAGE).read_text(encoding="utf-8")  # `make docs` writes it
    for declared in schema.documented_tables().values():
        name = declared.metadata[b"fleet.table"].decode()
        assert f"<!-- schema:{name} -->\n{schema.markdown(declared)}\n<!-- /schema -->" in page, name
