"""Every numeric flag of `fleet` is bounded, and every verb that reads a run takes a run id or a path.

The flags are found by walking the parser (argparse introspection), so a numeric flag added later
without bounds fails here: an out-of-range value must be argparse's one-line usage error naming the
flag, the value and what is expected (exit 2), never a traceback from deep inside a verb.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_compare import DIVERGED, SAME, write_run

from fleet import cli, cli_args

# Values no numeric flag may accept: negative, absurdly large, not finite, not a number.
BAD_VALUES = ["-3", "-1e9", "1000000000000", "1e308", "nan", "inf", "three"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse's own exits
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def numeric_flags() -> Iterator[tuple[str, argparse.Action]]:
    """(verb, action) for every option whose type turns text into a number."""
    parser = cli_args.parser()
    [verbs] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for verb, sub in verbs.choices.items():
        for action in sub._actions:
            if not action.option_strings or not callable(action.type):
                continue
            with contextlib.suppress(Exception):
                if isinstance(action.type("1"), int | float) and action.type is not bool:
                    yield verb, action


NUMERIC = [pytest.param(verb, action, id=f"{verb} {action.option_strings[-1]}") for verb, action in numeric_flags()]


def test_the_walk_finds_the_numeric_flags() -> None:
    assert {(verb, action.option_strings[-1]) for verb, action in numeric_flags()} >= {
        ("report", "--top"),
        ("calibrate", "--repeats"),
    }


@pytest.mark.parametrize(("verb", "action"), NUMERIC)
def test_every_numeric_flag_is_bounded(verb: str, action: argparse.Action, tmp_path: Path) -> None:
    flag = action.option_strings[-1]
    for value in BAD_VALUES:
        # `--flag=value`: argparse converts it as it reads it, before any verb (or a missing
        # positional) is looked at, so the message can only be about this flag.
        code, _, err = run_cli([verb, f"{flag}={value}"])
        assert code == 2, (flag, value, err)
        assert "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
        assert f"argument {flag}" in err and repr(value) in err and "expected" in err, err
    assert action.default is None or action.type(str(action.default)) == action.default  # its default is in range


def test_report_top_negative_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a", {"cand": SAME})
    code, out, err = run_cli(["report", str(run), "--top", "-3"])
    assert (code, out) == (2, "")
    assert "argument --top: '-3': expected an integer from 1 to" in err and "Traceback" not in err


def test_compare_takes_run_ids_under_results_like_report(tmp_path: Path) -> None:
    write_run(tmp_path / "results" / "a", {"cand": SAME})
    write_run(tmp_path / "results" / "b", {"cand": DIVERGED})
    by_path = run_cli(["compare", str(tmp_path / "results" / "a"), str(tmp_path / "results" / "b")])
    by_id = run_cli(["compare", "a", "b", "--results", str(tmp_path / "results")])
    assert by_path[0] == by_id[0] == 0, by_id[2]
    assert by_id[1] == by_path[1]
    code, _, err = run_cli(["compare", "a", "nope", "--results", str(tmp_path / "results")])
    assert code == 2 and "nope: not a run directory, nor a run id under" in err, err


def test_num_cpus_sizes_the_private_ray(fleet_cache: Path, tmp_path: Path) -> None:
    """`fleet run --num-cpus 3` on a 2-core machine: the private Ray has 3 CPU slots (run.json's
    cluster says so), e.g. for a tensor-parallel CPU target beside its reference. A subprocess: a
    process holds one Ray, and this one must be fleet's own private one."""
    import json
    import os
    import subprocess
    import sys

    from conftest import DOUBLE_MANIFEST

    (tmp_path / "m.yaml").write_text(DOUBLE_MANIFEST.split("gates:")[0])  # the run, not a verdict
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"FLEET_CACHE": str(fleet_cache)}
    cmd = [sys.executable, "-m", "fleet", "run", str(tmp_path / "m.yaml"), "--num-cpus", "3", "--no-progress"]
    cmd += ["--results", str(tmp_path / "results"), "--run-id", "sized"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((tmp_path / "results" / "sized" / "run.json").read_text())
    assert info["cluster"]["resources"]["CPU"] == 3.0


def test_num_cpus_is_refused_for_a_cluster_it_does_not_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import DOUBLE_MANIFEST

    (tmp_path / "m.yaml").write_text(DOUBLE_MANIFEST)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # refused before any connection is tried
    code, _, err = run_cli(["run", str(tmp_path / "m.yaml"), "--num-cpus", "3", "--results", str(tmp_path / "r")])
    assert code == 2 and "--num-cpus sizes the private Ray" in err and "10.0.0.1:6379" in err, err
    assert not (tmp_path / "r").exists()
