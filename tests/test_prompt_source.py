"""Prompt files at dataset scale: JSONL, Parquet and CSV with a column mapping, cut into row
ranges that the shards read themselves; bad files are refused naming the file and the row."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet.contracts.errors import ManifestError
from fleet.contracts.prompt_source import PromptFile, check, chunks, read_slice
from fleet.contracts.spec import Shard
from fleet.run.manifest_file import load
from fleet.run.plan import plan_shards

GSM = [
    {"idx": 7, "question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"idx": 8, "question": "What is 10 minus 6?", "answer": "#### 4"},
    {"idx": 9, "question": "Half of 1,000?", "answer": "#### 500"},
]
MAPPING = "id: idx, prompt: question, expected: {number: answer}"


def _write(tmp: Path, fmt: str, rows: list[dict[str, object]], *, row_group_size: int | None = None) -> Path:
    path = tmp / f"gsm.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" + ("\n" if i == 1 else "") for i, r in enumerate(rows)))
    else:
        cols = list(rows[0])
        lines = [",".join(cols)] + [",".join(json.dumps(str(r[c])) for c in cols) for r in rows]
        path.write_text("\n".join(lines).replace("\\n", " ") + "\n")
    return path


def _manifest(tmp: Path, prompts: str, *, shard_size: int = 2) -> Path:
    path = tmp / "m.yaml"
    path.write_text(
        "models: [{name: m, source: {kind: synthetic}}]\n"
        f"prompts: {{gsm: {prompts}}}\n"
        "targets: [{name: ref, kind: test-double}, {name: cand, kind: test-double}]\nreference: ref\n"
        f"run: {{shard_size: {shard_size}}}\n"
    )
    return path


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_mapped_columns_become_prompts_read_by_slice(tmp_path: Path, fmt: str) -> None:
    _write(tmp_path, fmt, GSM, row_group_size=2)
    m = load(_manifest(tmp_path, f"{{file: gsm.{fmt}, {MAPPING}}}"))
    source = m.prompts["gsm"]
    assert isinstance(source, PromptFile)
    assert source.rows == 3 and source.sha256 and source.file.is_absolute()
    shards = plan_shards(m)
    # 2 targets x 2 shards; no shard holds prompts in the driver, only its row range.
    assert [(s.target, s.index, s.rows.start, s.rows.stop) for s in shards if s.rows] == [
        ("ref", 0, 0, 2),
        ("ref", 1, 2, 3),
        ("cand", 0, 0, 2),
        ("cand", 1, 2, 3),
    ]
    assert all(s.prompts == () for s in shards)
    loaded = [p for s in shards[:2] for p in s.loaded().prompts]
    assert [p.id for p in loaded] == ["7", "8", "9"]
    assert loaded[0].prompt == GSM[0]["question"]
    assert [p.expected.number for p in loaded if p.expected] == [7, 4, 500]
    assert [p.id for p in m.prompt_list("gsm")] == ["7", "8", "9"]


def test_inline_form_jsonl_still_loads(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "prompt": "x"},
        {"id": "b", "messages": [{"role": "user", "content": "2+2?"}], "expected": {"number": 4}},
    ]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    m = load(_manifest(tmp_path, "{file: p.jsonl}"))
    prompts = m.prompt_list("gsm")
    assert prompts[1].messages is not None and prompts[1].messages[0].content == "2+2?"
    assert prompts[1].expected is not None and prompts[1].expected.number == 4


def test_slices_cover_every_row_once(tmp_path: Path) -> None:
    rows = [{"idx": i, "question": f"q{i}", "answer": str(i)} for i in range(1000)]
    for fmt in ("parquet", "jsonl", "csv"):
        source = check(PromptFile(file=_write(tmp_path, fmt, rows, row_group_size=97), id="idx", prompt="question"))
        ids = [p.id for piece in chunks(source, 64) for p in read_slice(piece)]
        assert ids == [str(i) for i in range(1000)], fmt


@pytest.mark.parametrize(
    ("content", "mapping", "error"),
    [
        (
            '{"idx": 1, "question": "a"}\n{"idx": 1, "question": "b"}\n',
            MAPPING.split(", expected")[0],
            "duplicate ids: 1",
        ),
        ('{"idx": 1, "question": "a"}\nnot json\n', "id: idx, prompt: question", r"gsm.jsonl: row 2: not JSON"),
        ('{"idx": 1, "q": "a"}\n', "id: idx, prompt: question", r"row 1: no column 'question'"),
        ('{"idx": 1, "question": "a", "answer": "none"}\n', MAPPING, r"row 1: column 'answer' holds no number"),
    ],
)
def test_bad_rows_name_the_file_and_row(tmp_path: Path, content: str, mapping: str, error: str) -> None:
    (tmp_path / "gsm.jsonl").write_text(content)
    with pytest.raises(ManifestError, match=error):
        load(_manifest(tmp_path, f"{{file: gsm.jsonl, {mapping}}}"))


def test_check_leaves_the_cycle_collector_as_it_found_it(tmp_path: Path) -> None:
    """The check turns Python's cycle collector off while it reads (fleet/contracts/prompt_source.py);
    after it, passed or failed, the collector is as it was: on stays on, off stays off."""
    good = PromptFile(file=_write(tmp_path, "parquet", GSM), id="idx", prompt="question")
    bad = PromptFile(file=_write(tmp_path, "jsonl", [*GSM, {"idx": 10}]), id="idx", prompt="question")
    assert gc.isenabled()
    try:
        assert check(good).rows == 3
        assert gc.isenabled()
        with pytest.raises(ValueError, match="row 4: no column 'question'"):  # raised while it reads
            check(bad)
        assert gc.isenabled()
        gc.disable()
        check(good)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_csv_record_across_lines_is_refused(tmp_path: Path) -> None:
    (tmp_path / "gsm.csv").write_text('idx,question\n1,"two\nlines"\n2,b\n')
    with pytest.raises(ManifestError, match="convert such a file to Parquet or JSONL"):
        load(_manifest(tmp_path, "{file: gsm.csv, id: idx, prompt: question}"))


def test_missing_file_and_changed_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="prompt set 'gsm': prompts file not found"):
        load(_manifest(tmp_path, "{file: nope.parquet}"))
    _write(tmp_path, "parquet", GSM)
    m = load(_manifest(tmp_path, f"{{file: gsm.parquet, {MAPPING}}}"))
    resolved = m.model_dump(mode="json")
    _write(tmp_path, "parquet", GSM[:2])  # the file changed after the run started: resume refuses it
    with pytest.raises(ValueError, match="not the file this run started with"):
        type(m).model_validate(resolved)


def test_shard_without_file_is_its_own_prompts() -> None:
    shard = Shard("m", "t", "s", 0, ())
    assert shard.loaded() is shard


def test_run_reads_prompts_from_a_parquet_file(local_ray: object, tmp_path: Path) -> None:
    """The whole pipeline (test-double reference and candidate, so scoring runs) on a file's row
    ranges: every row once, ids, text and expected answers as in the file."""
    import polars as pl

    from fleet.results import reader
    from fleet.run import driver

    rows = [{"idx": i, "question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(50)]
    _write(tmp_path, "parquet", rows, row_group_size=16)
    run_dir, outcome = driver.run(
        _manifest(tmp_path, f"{{file: gsm.parquet, {MAPPING}}}", shard_size=7),
        results_dir=tmp_path / "r",
        progress=False,
    )
    assert not outcome.partial, outcome
    requests = reader.load(run_dir)["requests"].collect()
    assert requests.height == 100 and requests["run_id"].unique().to_list() == [Path(str(run_dir)).name]
    ref = requests.filter(pl.col("target") == "ref").sort(pl.col("prompt_id").cast(pl.Int64))
    assert ref["prompt"].to_list() == [r["question"] for r in rows]
    assert ref["expected"].to_list() == [f'{{"number": {i + 1}.0}}' for i in range(50)]
    tokens = reader.load(run_dir)["tokens"].collect()
    assert tokens.filter(pl.col("target") == "cand")["ref_logprob"].null_count() == 0  # scored


# Every reader is strict: a malformed file, whatever its format, is one error naming the file, the
# row and what was expected, raised by the check before any shard runs (nothing is half-read).
MALFORMED = {
    "csv quote never closed, last row": ("csv", b'id,prompt\na,hello\nb,"world\n', "row 2: a quote is opened"),
    "csv quote never closed, first row": ("csv", b'id,prompt\na,"hello\nb,world\n', "row 1: a quote is opened"),
    "csv text after a closing quote": ("csv", b'id,prompt\na,"hel"lo"\nb,x\n', "row 1: not a CSV record"),
    "csv a field too many": ("csv", b"id,prompt\na,hello,x\n", "row 1: 3 fields, expected 2 as in the header"),
    "csv a field too few": ("csv", b"id,prompt\na,hello\nb\n", "row 2: 1 fields, expected 2"),
    "csv not utf-8": ("csv", b"id,prompt\na,caf\xe9\n", "row 1: not UTF-8 text"),
    "csv column named twice": ("csv", b"id,prompt,prompt\na,b,c\n", "header: column 'prompt' named twice"),
    "csv quote never closed in the header": ("csv", b'id,"prompt\na,b\n', "header: a quote is opened"),
    "jsonl not json": ("jsonl", b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": \n', "row 2: not JSON"),
    "jsonl not an object": ("jsonl", b'["a", "x"]\n', "row 1: expected a JSON object, got list"),
    "jsonl not utf-8": ("jsonl", b'{"id": "a", "prompt": "caf\xe9"}\n', "row 1: not UTF-8 text"),
    "jsonl prompt not text": ("jsonl", b'{"id": "a", "prompt": [1, 2]}\n', "row 1: column 'prompt' holds list"),
    "jsonl id a float": ("jsonl", b'{"id": 1.5, "prompt": "x"}\n', "row 1: column 'id' holds float"),
    "jsonl expected not an object": (
        "jsonl",
        b'{"id": "a", "prompt": "x", "expected": 4}\n',
        "row 1: column 'expected'",
    ),
    "jsonl expected two rules": (
        "jsonl",
        b'{"id": "a", "prompt": "x", "expected": {"exact": "a", "regex": "b"}}\n',
        "row 1: column 'expected': expected needs exactly one of",
    ),
    "jsonl messages text not json": (
        "jsonl",
        b'{"id": "a", "messages": "[{"}\n',
        "row 1: column 'messages' is not JSON",
    ),
    "parquet truncated": ("parquet", None, "cannot read gsm.parquet"),
}


@pytest.mark.parametrize(("fmt", "content", "error"), MALFORMED.values(), ids=MALFORMED.keys())
def test_every_reader_refuses_a_malformed_file(tmp_path: Path, fmt: str, content: bytes | None, error: str) -> None:
    path = tmp_path / f"gsm.{fmt}"
    if content is None:  # a Parquet file cut short: its footer is gone
        _write(tmp_path, "parquet", GSM)
        path.write_bytes(path.read_bytes()[:-40])
    else:
        path.write_bytes(content)
    with pytest.raises(ManifestError, match="prompt set 'gsm'") as e:
        load(_manifest(tmp_path, f"{{file: gsm.{fmt}}}"))
    assert error in str(e.value) and "gsm." in str(e.value), str(e.value)
    assert "Traceback" not in str(e.value) and "errors.pydantic.dev" not in str(e.value)
