"""Bad input never crashes, hostile input never escapes: one regression test per class of issue 10.

Every case goes through the CLI as a user types it (`fleet.cli.main`, in process): exit 2, one
message of at most 3 lines naming the file and field, no traceback, nothing written. Manifests are
checked with `fleet run --check`, which does everything `fleet run` does before Ray starts.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet import cli
from fleet.contracts.errors import UserError
from fleet.contracts.inputs import load_yaml

ROOT = Path(__file__).resolve().parents[1]
TINY = (ROOT / "manifests" / "tiny.yaml").read_text()


def run_cli(*argv: str | Path) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `fleet ARGV`, argparse's exits included."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def assert_user_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 3, err
    assert all(len(line) <= 420 for line in lines), err
    for needle in needles:
        assert needle in err, (needle, err)


def check(tmp_path: Path, text: str | bytes, *needles: str) -> str:
    """`fleet run --check` on a manifest with this text: a user error, nothing written."""
    path = tmp_path / "m.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = files(tmp_path)
    code, _, err = run_cli("run", "--check", path, "--results", tmp_path / "results")
    assert_user_error(code, err, *needles)
    assert files(tmp_path) == before
    return err


def with_source(source: str) -> str:
    """tiny.yaml with its model's source replaced by `source` (flow-style YAML)."""
    text = re.sub(r"    source:\n(      .*\n)+", lambda _: f"    source: {source}\n", TINY)
    assert source in text
    return text


def tiny(**replace: str) -> str:
    text = TINY
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


# --- tracebacks that were ------------------------------------------------------------------------


def test_unreadable_manifests(tmp_path: Path) -> None:
    check(tmp_path, b"models: \xff\xfe\n", "m.yaml", "not UTF-8")
    check(tmp_path, TINY.replace("tiny-llama", "tiny\0llama").encode(), "m.yaml", "not valid YAML")
    (tmp_path / "dir.yaml").mkdir()
    code, _, err = run_cli("run", "--check", tmp_path / "dir.yaml")
    assert_user_error(code, err, "dir.yaml", "is a directory")
    code, _, err = run_cli("run", "--check", "nul\0.yaml")
    assert_user_error(code, err, "cannot read the manifest")
    if os.geteuid() != 0:  # root reads anything
        (tmp_path / "locked.yaml").write_text(TINY)
        (tmp_path / "locked.yaml").chmod(0)
        code, _, err = run_cli("run", "--check", tmp_path / "locked.yaml")
        assert_user_error(code, err, "locked.yaml", "cannot read")


def test_scalars_pyyaml_rejects_are_user_errors(tmp_path: Path) -> None:
    check(tmp_path, tiny(**{"id: capital": "id: !!timestamp 2024-13-45"}), "m.yaml", "not valid YAML")
    # An impossible date written plainly is a string, as an id should be.
    assert load_yaml("id: 2024-13-45", source="x") == {"id": "2024-13-45"}


def test_wrong_types_in_validators_are_field_errors(tmp_path: Path) -> None:
    check(tmp_path, tiny(**{"smollm-six:\n": "smollm-six: {file: 42}\n  x:\n"}), "prompts", "path")
    matrix = "{name: hf-cpu-fp32, kind: hf, device: cpu, dtype: float32, matrix: {1: [a]}}"
    check(tmp_path, tiny(**{"{name: hf-cpu-fp32, kind: hf, device: cpu, dtype: float32}": matrix}), "matrix keys")
    beside = "targets:\n  - {name: v, kind: vllm, matrix: {dtype: [float32]}}\n  - just-a-string\n"
    check(tmp_path, tiny(**{"targets:\n": beside}), "targets[1]")
    probe = "reference: nobody\nprobes: {logits: {prompt_set: smollm-six}}\n"
    check(tmp_path, tiny(**{"reference: hf-cpu-fp32\n": probe}), "reference 'nobody' names no target")


def test_nul_in_a_path_and_hub_ids_with_dotdot(tmp_path: Path) -> None:
    check(tmp_path, with_source('{kind: path, path: "a\\0b"}'), "models[0].source.path", "not a usable path")
    check(tmp_path, with_source("{kind: hf, id: org/a..b}"), "models[0].source.id", "cannot contain '..'")


def test_names_too_long_for_the_file_system_fail_before_start(tmp_path: Path) -> None:
    check(tmp_path, tiny(**{"name: tiny-llama": "name: " + "x" * 300}), "models[0].name", "at most 128")
    code, _, err = run_cli("run", "--check", ROOT / "manifests" / "tiny.yaml", "--run-id", "r" * 300)
    assert_user_error(code, err, "--run-id")


def test_damaged_run_directories(double_run: Path, tmp_path: Path) -> None:
    def damaged(edit: Any) -> Path:
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        shutil.copytree(double_run, run)
        edit(run)
        return run

    cases = {
        "not valid JSON": damaged(lambda r: (r / "run.json").write_text("{not json")),
        "expected a JSON object": damaged(lambda r: (r / "run.json").write_text("[1, 2]")),
        "no 'reference'": damaged(lambda r: (r / "run.json").write_text(json.dumps({"status": "complete"}))),
        "not a readable Parquet file": damaged(
            lambda r: next(r.glob("tokens/**/*.parquet")).write_bytes(b"PAR1 truncated")
        ),
    }
    for needle, run in cases.items():
        before = files(tmp_path)
        for argv in (["report", run], ["query", run, "SELECT * FROM parity"], ["compare", run, double_run]):
            code, _, err = run_cli(*argv)
            assert_user_error(code, err, needle)
        if "Parquet" not in needle:  # resume reads run.json and the shards table, not the tokens
            code, _, err = run_cli("run", "--check", "--resume", run)
            assert_user_error(code, err, needle)
        assert files(tmp_path) == before
    code, _, err = run_cli("report", double_run / "run.json")  # a file, not a run directory
    assert_user_error(code, err, "not a run directory")


def test_report_output_into_a_missing_folder_fails_before_the_summary(double_run: Path, tmp_path: Path) -> None:
    code, out, err = run_cli("report", double_run, "--html", tmp_path / "missing" / "r.html")
    assert_user_error(code, err, "missing", "cannot write there")
    assert out == ""  # nothing printed first, then a crash


def test_report_output_that_cannot_be_made_is_a_clear_error(double_run: Path) -> None:
    """A folder that exists but takes no such file (/proc: the check before the work passes)."""
    code, _, err = run_cli("report", double_run, "--markdown", "/proc/fleet-report.md")
    assert_user_error(code, err, "/proc/fleet-report.md: cannot write it")


def test_an_internal_error_is_a_traceback_and_says_it_is_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.run import check as before_ray

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("an invariant broke")

    monkeypatch.setattr(before_ray, "check", broken)
    code, _, err = run_cli("run", "--check", ROOT / "manifests" / "tiny.yaml")
    assert code == 1
    assert "Traceback" in err and "RuntimeError: an invariant broke" in err
    assert err.strip().splitlines()[-1].startswith("error: this is a bug in fleet-eval")


# --- bad input that was accepted -----------------------------------------------------------------


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    twice = "prompts:\n  smollm-six: [{id: a, prompt: x}]\n  smollm-six: [{id: b, prompt: y}]\n"
    check(tmp_path, tiny(**{"prompts:\n": twice + "  other:\n"}), "duplicate key 'smollm-six'", "line")


def test_max_tokens_beyond_a_known_context(tmp_path: Path) -> None:
    # The synthetic model's own context is 512; the vLLM targets set 256.
    check(tmp_path, tiny(**{"max_tokens: 20": "max_tokens: 300"}), "vllm-cpu-fp32", "context of 256")
    check(tmp_path, tiny(**{"max_tokens: 20": "max_tokens: 600"}), "hf-cpu-fp32", "context of 512")
    perf = "perf:\n  - {name: big, concurrency: [1], input_tokens: 250, output_tokens: 16, num_requests: 2}\n"
    check(tmp_path, tiny() + perf, "perf 'big'", "over its context of 256")


def test_an_unresolvable_source_for_every_model_fails_before_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    (tmp_path / "m.yaml").write_text(with_source("{kind: hf, id: nobody/no-such-model}"))
    code, _, err = run_cli("run", tmp_path / "m.yaml", "--results", tmp_path / "results")  # not --check
    assert_user_error(code, err, "no model's source can be resolved", "not in the local HF cache")
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("run.shard_size", 10**12, "shard_size"),
        ("run.shard_timeout_s", 1e30, "shard_timeout_s"),
        ("run.max_attempts", 10**6, "max_attempts"),
        ("sampling.seed", -1, "seed"),
        ("sampling.temperature", float("nan"), "temperature"),
    ],
)
def test_numeric_bounds(tmp_path: Path, field: str, value: Any, needle: str) -> None:
    manifest = yaml.safe_load(TINY)
    section, key = field.split(".")
    manifest.setdefault(section, {})[key] = value
    check(tmp_path, yaml.safe_dump(manifest), needle)


# --- escapes -------------------------------------------------------------------------------------


def test_run_ids_cannot_leave_the_results_directory(tmp_path: Path) -> None:
    for run_id in ("../x", str(tmp_path / "abs"), "a/b", ".hidden", ""):
        code, _, err = run_cli(
            "run", "--check", ROOT / "manifests" / "tiny.yaml", "--results", tmp_path / "r", "--run-id", run_id
        )
        assert_user_error(code, err, "--run-id")
    assert list(tmp_path.iterdir()) == []


def test_gguf_versions_cannot_name_a_directory_outside_the_cache(tmp_path: Path) -> None:
    from actors import gguf
    from actors.build_once import build_once

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    escape = "0/../../../" + str(victim).lstrip("/")
    source = f"{{kind: gguf, package: llm-x, version: '{escape}', file: x.gguf}}"
    check(tmp_path, with_source(source), "models[0].source.version")
    # Below the manifest: the cache entry is a hash of the spec, and build_once refuses any other.
    wheels = tmp_path / "cache" / "wheels"
    assert gguf.wheel_dir("llm-x", escape, wheels).parent == wheels
    with pytest.raises(UserError, match="not a directory directly in"):
        build_once(wheels / "llm-x-0" / ".." / ".." / ".." / "victim", lambda _: "", marker="m", root=wheels)
    assert (victim / "precious").read_text() == "keep me"


SENTINEL = "sk-fleet-sentinel-3f9a1c"


ENDPOINT = "{name: e, kind: endpoint, base_url: '%s'}"


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        (ENDPOINT % f"http://u:{SENTINEL}@h:8000/v1", "credentials in the URL"),
        (ENDPOINT % f"http://h:8000/v1?api_key={SENTINEL}", "look like credentials"),
        (ENDPOINT % f"http://h:8000/v1?x=1&access_token={SENTINEL}", "look like credentials"),
        (f"{{name: v, kind: vllm, env: {{HF_TOKEN: {SENTINEL}}}}}", "looks like a credential"),
        (f"{{name: v, kind: vllm-server, env: {{MY_API_KEY: {SENTINEL}}}}}", "looks like a credential"),
    ],
)
def test_secrets_are_refused_without_being_repeated(tmp_path: Path, target: str, needle: str) -> None:
    err = check(tmp_path, tiny(**{"targets:\n": f"targets:\n  - {target}\n"}), needle)
    assert SENTINEL not in err


def test_secrets_in_the_results_uri_are_refused_without_being_repeated(tmp_path: Path) -> None:
    for uri in (f"s3://bucket/p?secret_key={SENTINEL}", f"s3://key:{SENTINEL}@bucket/p"):
        code, out, err = run_cli("run", "--check", ROOT / "manifests" / "tiny.yaml", "--results", uri)
        assert_user_error(code, err, "--results")
        assert SENTINEL not in err + out
    assert list(tmp_path.iterdir()) == []


def test_the_test_double_is_opt_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = tiny(**{"kind: hf, device: cpu, dtype: float32}": "kind: test-double}"})
    (tmp_path / "ok.yaml").write_text(text)
    assert run_cli("run", "--check", tmp_path / "ok.yaml")[0] == 0  # the suite sets the variable
    monkeypatch.delenv("FLEET_ALLOW_TEST_DOUBLE")
    check(tmp_path, text, "targets[0]", "FLEET_ALLOW_TEST_DOUBLE=1")


def test_gates_never_pass_on_a_test_double_and_compare_flags_it(double_run: Path) -> None:
    from fleet.report import compare
    from fleet.report.model import RunReport

    report = RunReport.build(double_run)
    assert report.verdicts is not None and report.verdicts.height
    assert set(report.verdicts["verdict"]) == {"FAIL"}
    assert report.verdicts["reason"].str.contains("test double").all()
    assert run_cli("report", double_run)[0] == cli.EXIT_GATES
    frame = compare.compare(double_run, double_run)
    assert frame["test_double"].all()
    assert "(TEST DOUBLE: no model ran" in compare.render(frame, run_a=double_run, run_b=double_run)


# --- messages ------------------------------------------------------------------------------------


def test_messages_are_short_whatever_the_input(tmp_path: Path) -> None:
    many = tiny(**{"max_tokens: 20": "max_tokens: -1\n  seed: -5\n  temperature: -3\n  colour: red"})
    err = check(tmp_path, many, "4 error(s) (the first 2 shown)")
    long_value = tiny(**{"dtype: float32, max_model_len: 256}": f"dtype: {'x' * 200_000}, max_model_len: 256}}"})
    err = check(tmp_path, long_value, "targets[1].dtype")
    assert len(err) < 1000
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"] + [
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefg", "bcdefgh", strict=False)
    ]
    check(tmp_path, TINY + "\n".join(levels) + "\n", "alias bomb")
    code, _, err = run_cli("query", tmp_path, "SELECT nosuch FROM tokens")
    assert_user_error(code, err, "query failed")


def test_usage_errors_are_one_line() -> None:
    for argv in (["bogus"], ["run", "--nope"], ["query"], ["report", "--html"], []):
        code, _, err = run_cli(*argv)
        assert code == 2 and len(err.strip().splitlines()) == 1, err


def test_a_valid_manifest_checks_clean(tmp_path: Path) -> None:
    code, out, err = run_cli("run", "--check", ROOT / "manifests" / "tiny.yaml", "--results", tmp_path / "r")
    assert (code, err) == (0, "") and "would run into" in out
    assert list(tmp_path.iterdir()) == []


def test_manifest_errors_name_the_file(tmp_path: Path) -> None:
    err = check(tmp_path, textwrap.dedent("models: []\n"), "m.yaml")
    assert err.startswith("error: ")


def test_writes_are_checked_to_stay_inside_their_root(tmp_path: Path) -> None:
    from fleet.contracts.inputs import inside

    inside(tmp_path, tmp_path / "t" / "x.parquet", what="rows")
    (tmp_path / "link").symlink_to("/")
    for escape in (tmp_path / ".." / "x", tmp_path / "link" / "etc", Path("/elsewhere")):
        with pytest.raises(UserError, match="outside"):
            inside(tmp_path, escape, what="rows")
    with pytest.raises(UserError, match="outside"):
        inside("bucket/run", "bucket/run/../other/x.parquet", what="rows", local=False)
    endpoint = "s3://bucket/run?endpoint_override=http://127.0.0.1:9000"
    inside(endpoint, "s3://bucket/run/r1?endpoint_override=http://127.0.0.1:9000", what="run directory")
