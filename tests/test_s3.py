"""Results on an object store: `fleet run --results s3://bucket/prefix`, then report, load, query,
compare and resume from the URI, against moto's S3 server started on 127.0.0.1 for this module.

The engines are the labelled `test-double` backend (tests/test_faults.py): this is about storage.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mdcheck
import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from own_ports import free_port

from fleet import cli
from fleet.analysis import query
from fleet.contracts.errors import UserError
from fleet.report import compare
from fleet.report import html as html_report
from fleet.report.model import RunReport
from fleet.results import catalog, reader, store
from fleet.results.store import RunStore

MANIFEST = textwrap.dedent(
    """
    models:
      - {name: m1, source: {kind: synthetic, seed: 1}}
    prompts:
      p: [{id: q0, prompt: "question 0"}, {id: q1, prompt: "question 1"},
          {id: q2, prompt: "question 2"}, {id: q3, prompt: "question 3"}]
    targets:
      - {name: ref, kind: test-double, num_cpus: 0.5}
      - {name: cand, kind: test-double, num_cpus: 0.5, logprob_shift: 0.01}
    reference: ref
    sampling: {max_tokens: 8, logprobs: 3}
    run: {shard_size: 2}
    """
)
SHARDS = {f"m1/{target}/p/{chunk:05d}" for target in ("ref", "cand") for chunk in (0, 1)}


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """s3://bucket/prefix on a moto server bound to loopback, in its own process (moto's Flask app
    in this process would upset vLLM engines built here later); stopped, port closed, at the end."""
    host, port = "127.0.0.1", free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                socket.create_connection((host, port), timeout=1).close()
                break
            time.sleep(0.1)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("FLEET_S3_ENDPOINT", f"http://{host}:{port}")
            env.setenv("AWS_ACCESS_KEY_ID", "testing")
            env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            env.setenv("AWS_REGION", "us-east-1")
            env.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no credential probing of 169.254.169.254
            s3fs = pafs.S3FileSystem(endpoint_override=f"http://{host}:{port}", allow_bucket_creation=True)
            s3fs.create_dir("bucket")
            yield "s3://bucket/prefix"
    finally:
        server.terminate()
        server.wait(timeout=30)
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection((host, port), timeout=1).close()


def objects(uri: str) -> dict[str, bytes]:
    fs, root = store.locate(uri)
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return {f.path: fs.open_input_stream(f.path).read() for f in found if f.type == pafs.FileType.File}


def test_store_on_s3(s3: str) -> None:
    run = RunStore.create(f"{s3}/unit", {"run_id": "unit"})
    row = {"model": ["m"], "model_weights": ["w"], "target": ["t"], "prompt_set": ["s"], "shard_id": ["m/t/s/00000"]}
    path = run.write("shards", "m/t/s/00000", pa.table(row))
    assert path == f"{s3}/unit/shards/model=m/model_weights=w/target=t/s-00000.parquet"
    assert run.completed_shards() == {"m/t/s/00000"}
    run.update_info(status="complete")
    assert run.info()["status"] == "complete" and run.info()["run_id"] == "unit"
    assert sorted(objects(f"{s3}/unit")) == [
        "bucket/prefix/unit/run.json",
        "bucket/prefix/unit/shards/model=m/model_weights=w/target=t/s-00000.parquet",
    ]
    with pytest.raises(FileExistsError):
        RunStore.create(f"{s3}/unit", {})
    with pytest.raises(UserError, match="lost a slash"):
        RunStore(str(Path(s3) / "unit"))


def test_staging_on_s3(s3: str) -> None:
    """Taking turns on an object store: staged shards are objects under .staging/ that no reader
    lists, read back whole, and removed by drop and by recover (test_take_turns.py, locally)."""
    from test_take_turns import generation

    from fleet.results.staging import Staging

    run = RunStore.create(f"{s3}/staged", {"run_id": "staged", "reference": "ref"})
    staging = Staging(run)
    staging.put(generation("m/c/p/00000", 2))
    staging.put(generation("m/c/p/00001", 0))
    assert staging.get("m/c/p/00000", "w").tokens.num_rows == 2
    assert reader.load(f"{s3}/staged")["requests"].collect().height == 0
    assert staging.recover({"m/c/p/00000"}) == {"m/c/p/00000": "w"}  # 00001 committed meanwhile
    staging.drop("m/c/p/00000", "w")
    assert sorted(objects(f"{s3}/staged")) == ["bucket/prefix/staged/run.json"]


def test_packed_shards_on_s3(s3: str, tmp_path: Path) -> None:
    """The driver path to an object store (`run.write: driver`): a shard the actors encoded is
    stored in one PUT per file and staged as bytes (tests/test_packed.py, locally)."""
    from test_packed import double_engines, shard_of

    from fleet.results.packed import WHOLE, PackSink
    from fleet.results.staging import Staging

    ref, cand = double_engines(tmp_path)
    run = RunStore.create(f"{s3}/packed", {"run_id": "packed"})
    whole = PackSink("packed", reference="ref").generated(ref.generate(shard_of("ref", 4)))
    for table in WHOLE:
        run.put_encoded(table, whole.shard_id, *whole.files[table])
    run.write("shards", whole.shard_id, whole.shard)
    assert run.completed_shards() == {"m/ref/p/00000"}
    t = {name: frame.collect() for name, frame in reader.load(f"{s3}/packed").items()}
    assert t["tokens"].height == whole.tokens > 0 and set(t["tokens"]["run_id"]) == {"packed"}
    assert t["prompt_stats"].height == t["requests"].height == 4
    staged = PackSink("packed", reference="ref").generated(cand.generate(shard_of("cand", 2)))
    staging = Staging(run)
    weights = staging.put(staged)
    assert staging.packed(staged.shard_id, weights).files == staged.files
    staging.drop(staged.shard_id, weights)
    assert not [key for key in objects(f"{s3}/packed") if "/.staging/" in key]


def test_endpoint_knobs(s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    RunStore.create(f"{s3}/knobs", {"run_id": "knobs"})
    endpoint, nowhere = os.environ["FLEET_S3_ENDPOINT"], "http://127.0.0.1:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL", nowhere)  # FLEET_S3_ENDPOINT wins over the AWS SDK's name
    assert RunStore(f"{s3}/knobs").info()["run_id"] == "knobs"
    monkeypatch.delenv("FLEET_S3_ENDPOINT")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    assert RunStore(f"{s3}/knobs").info()["run_id"] == "knobs"
    monkeypatch.setenv("AWS_ENDPOINT_URL", nowhere)  # the URI's own query wins over both
    assert RunStore(f"{s3}/knobs?endpoint_override={endpoint}").info()["run_id"] == "knobs"


def test_run_report_and_resume_from_s3(
    local_ray: Any, s3: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(MANIFEST)
    uri = f"{s3}/r1"
    assert cli.main(["run", str(manifest), "--results", s3, "--run-id", "r1", "--no-progress"]) == 0
    assert f"results: {uri}" in capsys.readouterr().out

    assert cli.main(["report", uri]) == 0
    summary = capsys.readouterr().out
    assert "# fleet-eval run r1" in summary and mdcheck.tables(summary)
    t = {name: frame.collect() for name, frame in reader.load(uri).items()}
    assert (t["requests"].height, t["tokens"].height, t["shards"].height) == (2 * 4, 2 * 4 * 8, 4)
    assert RunStore(uri).completed_shards() == SHARDS
    # On an object store the actors write their own rows (run.write auto): committed, none left staged.
    assert json.loads(objects(uri)["bucket/prefix/r1/run.json"])["write"] == "actors"
    assert not [key for key in objects(uri) if "/.staging/" in key]
    assert query.query(uri, "SELECT COUNT(*) AS n FROM tokens WHERE ref_logprob IS NOT NULL")["n"].item() == 4 * 8
    same = compare.compare(uri, uri)  # a run against itself (Polars' parallel sums differ in the last bits)
    assert same.height > 0 and same.filter(pl.col("delta").abs() > 1e-9).is_empty()
    assert "fleet-eval report: r1" in html_report.render_html(RunReport.build(uri, gates=[]))

    # The same run id again is refused before anything starts.
    assert cli.main(["run", str(manifest), "--results", s3, "--run-id", "r1", "--no-progress"]) == 2
    assert "already exists" in capsys.readouterr().err

    # Lose one shard's objects: resume redoes that shard and leaves every other object as it was.
    before = objects(uri)
    fs, _ = store.locate(uri)
    lost = [p for p in before if p.endswith("/target=cand/p-00001.parquet")]
    assert len(lost) == 4  # its requests, tokens, prompt_stats and shards files
    for path in lost:
        fs.delete_file(path)
    assert RunStore(uri).completed_shards() == SHARDS - {"m1/cand/p/00001"}
    assert cli.main(["run", "--resume", uri, "--no-progress"]) == 0
    after = objects(uri)
    assert set(after) == set(before)
    assert {p for p in before if after[p] != before[p]} - set(lost) == {"bucket/prefix/r1/run.json"}
    assert RunStore(uri).completed_shards() == SHARDS
    assert len(json.loads(after["bucket/prefix/r1/run.json"])["resumed_at"]) == 1
    # The driver's and the verdict's writes of run.json kept the root's catalog in step.
    [entry] = [key for key in objects(f"{s3}/_catalog/entries") if key.rsplit("/", 1)[-1].startswith("r1.")]
    assert json.loads(objects(f"{s3}/_catalog/entries")[entry])["status"] == "complete"
    assert catalog.runs(s3).filter(run_id="r1").select("status", "gates").row(0) == ("complete", "none")
    keys = ["target", "prompt_id", "position"]
    tokens = reader.load(uri)["tokens"].collect().select(*keys, "token_id", "logprob").sort(keys)
    assert tokens.equals(t["tokens"].select(*keys, "token_id", "logprob").sort(keys))
    assert tokens.filter(pl.col("target") == "cand").height == 4 * 8


def test_runs_on_s3_come_from_the_catalog(s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet runs` on an object store: one listing of the root, one of the catalog, one GET of its
    runs.json; a run put there by hand (no entry) is found, and so is every run with no catalog."""
    root = f"{s3}/many"
    row = {"model": ["m"], "model_weights": ["w"], "target": ["t"], "prompt_set": ["s"], "shard_id": ["m/t/s/00000"]}
    for name in ("a", "b"):
        run = RunStore.create(f"{root}/{name}", {"run_id": name, "reference": "ref"})
        run.write("shards", "m/t/s/00000", pa.table(row))
        run.update_info(status="complete")
    catalog.record_verdict(f"{root}/b", "PASS")
    entries = [key.rsplit("/", 1)[-1].split(".")[0] for key in objects(f"{root}/_catalog/entries")]
    assert sorted(entries) == ["a", "b"]  # one per run: older ones deleted
    catalog.runs(root)  # writes runs.json

    fs, _ = store.locate(root)
    for key, data in objects(f"{root}/a").items():  # copied by hand, under another name
        copy = json.loads(data) | {"run_id": "copied"} if key.endswith("/run.json") else None
        with fs.open_output_stream(key.replace("/many/a/", "/many/copied/")) as out:
            out.write(data if copy is None else json.dumps(copy).encode())
    read: list[str] = []
    original = RunStore.info
    monkeypatch.setattr(RunStore, "info", lambda self: read.append(str(self.run_dir)) or original(self))
    listed = catalog.runs(root).sort("run_id")
    assert listed.select("run_id", "status", "gates").rows() == [
        ("a", "complete", "not recorded"),
        ("b", "complete", "PASS"),
        ("copied", "complete", "not recorded"),
    ]
    assert read == [f"{root}/copied"]
    read.clear()
    assert catalog.runs(root).height == 3 and query.query(root, "SELECT COUNT(*) AS n FROM shards")["n"].item() == 3
    assert read == []  # the copied run's row is cached in runs.json; stacking reads no run.json

    for key in objects(f"{root}/_catalog"):  # no catalog at all: every run read from its run.json
        fs.delete_file(key)
    assert catalog.runs(root).sort("run_id")["run_id"].to_list() == ["a", "b", "copied"]
    assert sorted(read) == [f"{root}/{name}" for name in ("a", "b", "copied")]
