"""The run directory: atomic writes, the declared schema on disk, run.json bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet.contracts import schema, schema_docs
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
    page = (Path(__file__).parents[1] / schema_docs.TABLES_PAGE).read_text(encoding="utf-8")  # `make docs` writes it
    for declared in schema_docs.documented_tables().values():
        name = declared.metadata[b"fleet.table"].decode()
        assert f"<!-- schema:{name} -->\n{schema_docs.markdown(declared)}\n<!-- /schema -->" in page, name
    assert f"Schema version {schema.SCHEMA_VERSION} " in page  # the prose names the version files carry


def test_statistics_on_the_columns_readers_filter_on(tmp_path: Path) -> None:
    """Keys, ids and counts carry min/max in the footer (row groups and files prune on them); floats
    and lists do not (they never prune a shard's file, and cost the writer ~4 %)."""
    run = RunStore.create(tmp_path / "run", {"run_id": "run"})
    rows = _requests(3).append_column("ttft_s", pa.array([0.1, 0.2, 0.3]))
    rows = rows.append_column("output_token_ids", pa.array([[1, 2], [3], []], pa.list_(pa.int32())))
    group = pq.ParquetFile(run.write("requests", "m/t/s/00000", rows)).metadata.row_group(0)
    stats = {group.column(i).path_in_schema: group.column(i).statistics for i in range(group.num_columns)}
    assert stats["prompt_id"].min == "p0" and stats["prompt_id"].max == "p2"
    assert stats["n_output_tokens"].max == 2 and stats["model"].has_min_max
    assert stats["ttft_s"] is None and stats["output_token_ids.list.element"] is None


def test_the_writer_keeps_freed_memory_for_the_next_shard() -> None:
    """fleet/run/writer.py keep_freed_memory (glibc, as here and in CI): summarising a shard again
    takes its numpy temporaries from memory the last one freed, not from pages faulted in anew
    (2,800 faults for a 32,000-row shard without it). Counted in page faults, not timed."""
    import resource

    from fleet.results import prompt_rows
    from fleet.run.writer import keep_freed_memory

    assert keep_freed_memory()
    n = 20_000
    tokens = pa.table(
        {
            "model": ["m"] * n,
            "model_weights": ["w"] * n,
            "target": ["t"] * n,
            "prompt_set": ["s"] * n,
            "prompt_id": [f"p{i // 20}" for i in range(n)],
            "position": [i % 20 for i in range(n)],
            "token_id": list(range(n)),
            "logprob": [-0.5] * n,
            "topk_ids": [[i, i + 1, i + 2, i + 3, i + 4] for i in range(n)],
            "topk_logprobs": [[-0.5, -1.0, -2.0, -3.0, -4.0]] * n,
            "ref_logprob": [-0.6] * n,
            "ref_topk_ids": [[i + 1, i, i + 2, i + 5, i + 6] for i in range(n)],
            "ref_topk_logprobs": [[-0.4, -0.6, -2.5, -3.0, -3.5]] * n,
        }
    )
    prompt_rows.summarize(tokens)  # the first shard takes its memory from the kernel
    faults = []
    for _ in range(3):  # the fewest of three: the count is the process's, other threads fault too
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        prompt_rows.summarize(tokens)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert min(faults) < 300, faults


def test_footers_read_by_polars_are_pyarrows(tmp_path: Path) -> None:
    """The reader takes a local file's footer from Polars' metadata reader and the Arrow schema
    stored there; a file without one (another writer) is read by pyarrow, and the two agree."""
    from fleet.results import reader

    run = RunStore.create(tmp_path / "r", {"run_id": "r"})
    run.write("requests", "m/t/s/00000", _requests(3))
    [file] = (tmp_path / "r" / "requests").glob("**/*.parquet")
    meta = pq.read_metadata(file)
    footer, found = reader._local_footer(str(file)) or ({}, None)
    assert footer == meta.metadata and found == meta.schema.to_arrow_schema()
    pq.write_table(pq.read_table(file), file, store_schema=False)  # no ARROW:schema
    assert reader._local_footer(str(file)) is None
    assert reader.load(tmp_path / "r")["requests"].collect().height == 3
