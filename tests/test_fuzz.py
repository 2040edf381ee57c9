"""Property-based fuzzing of every input surface (Hypothesis, seeded: derandomize=True).

Three surfaces, a few hundred generated cases each: the example manifests under manifests/,
mutated (keys dropped or added, types swapped, unicode, NUL, `..`, huge numbers, long strings,
anchors, raw text damage) and checked with `fleet run --check`; a real run directory (made once
per session by the test double) with one file truncated, garbled, emptied or removed, then read by
report, query, compare and `run --check --resume`; and random command lines. For every case: exit
0 or 2 (or the documented 3 partial / 4 gate failed), no traceback, at most 3 lines on stderr, and
no file created except the one output the command was asked to write. Nothing here starts Ray:
validation runs first, so a case takes milliseconds to a fraction of a second.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet import cli

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "manifests").glob("*.yaml"))
CASES = 300
FUZZ = settings(
    max_examples=CASES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
ALLOWED_EXITS = {cli.EXIT_OK, cli.EXIT_USAGE, cli.EXIT_PARTIAL, cli.EXIT_GATES}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No network: hub sources and GGUF packages resolve from empty caches only (a clear error)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms-cache"))
    monkeypatch.setenv("FLEET_CACHE", str(tmp_path / "fleet-cache"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@contextlib.contextmanager
def sandbox() -> Iterator[Path]:
    """A fresh working directory per case (relative paths land in it), removed afterwards."""
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="fleet-fuzz-") as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(cwd)


def snapshot(*roots: Path) -> set[Path]:
    return {p for root in roots if root.exists() for p in root.rglob("*")}


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse: --help (0) and usage errors (2)
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_promise(code: int, err: str, argv: list[str]) -> None:
    where = f"fleet {' '.join(a[:80] for a in argv)[:400]!r}"
    assert code in ALLOWED_EXITS, f"{where}: exit {code}\n{err[-3000:]}"
    assert "Traceback" not in err, f"{where}\n{err[-3000:]}"
    assert len(err.strip().splitlines()) <= 3, f"{where}\n{err[:3000]}"


# --- values a user (or an attacker) might write --------------------------------------------------

ODD_TEXT = st.sampled_from(
    [
        "",
        " ",
        "..",
        "../../../x",
        "/etc/passwd",
        "a\0b",
        "ünï©ødé ✓",
        "x" * 5000,
        "a/b",
        ".hidden",
        "~",
        "-1",
        "${HOME}",
    ]
)
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    ODD_TEXT,
    st.text(max_size=40),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=2),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into a loaded YAML document."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        node = node[part]
    return node


@st.composite
def mutated_manifest(draw: st.DrawFn) -> str:
    """A valid example manifest with 1-4 structural mutations, or raw damage to its text."""
    source = draw(st.sampled_from(MANIFESTS))
    text = source.read_text()
    if draw(st.integers(0, 4)) == 0:  # raw text damage: YAML syntax, anchors, encodings
        kind = draw(st.sampled_from(["truncate", "insert", "anchor", "duplicate"]))
        at = draw(st.integers(0, len(text)))
        if kind == "truncate":
            return text[:at]
        if kind == "insert":
            return (
                text[:at]
                + draw(st.sampled_from(["\0", "\t", ": :", "- ", "{", "*x", "&a ", "!!python/object:os.system"]))
                + text[at:]
            )
        if kind == "anchor":
            return (
                "x: &a [1, 2]\n"
                + "\n".join(f"y{i}: &a{i} [*{'a' if i == 0 else f'a{i - 1}'}]" for i in range(8))
                + "\n"
                + text
            )
        line = draw(st.sampled_from(text.splitlines() or [""]))
        return text + "\n" + line + "\n"
    doc = yaml.safe_load(text)
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["drop", "replace", "add", "rename", "wrap"]))
        if not path:
            doc = draw(ODD_VALUES) if op == "replace" else doc
            continue
        parent, last = _get(doc, path[:-1]), path[-1]
        if op == "drop":
            del parent[last]
        elif op == "replace":
            parent[last] = draw(ODD_VALUES)
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.one_of(ODD_TEXT, st.text(max_size=10), st.integers()))] = draw(ODD_VALUES)
        elif op == "rename" and isinstance(parent, dict):
            parent[str(last) + draw(st.sampled_from(["_", "s", "\0", ".."]))] = parent.pop(last)
        elif op == "wrap":
            parent[last] = [parent[last]] if draw(st.booleans()) else {"x": parent[last]}
    try:
        return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    except yaml.YAMLError:  # a value PyYAML cannot represent: damage the text instead
        return text + "\n: broken\n"


@FUZZ
@given(text=mutated_manifest())
def test_fuzz_manifests(text: str) -> None:
    with sandbox() as tmp:
        path = tmp / "m.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        before = snapshot(tmp)
        argv = ["run", "--check", str(path), "--results", str(tmp / "results")]
        code, _, err = run_cli(argv)
        assert_promise(code, err, argv)
        assert snapshot(tmp) == before  # --check writes nothing


# --- damaged run directories ---------------------------------------------------------------------

COMMANDS = [
    ["report", "{run}"],
    ["report", "{run}", "--markdown", "{out}"],
    ["query", "{run}", "SELECT * FROM parity"],
    ["query", "{run}", "SELECT target, COUNT(*) AS n FROM tokens GROUP BY target"],
    ["query", "{run}", "--tables"],
    ["compare", "{run}", "{good}"],
    ["run", "--check", "--resume", "{run}"],
]


@FUZZ
@given(
    which=st.integers(0, 10_000),
    damage=st.sampled_from(["truncate", "garble", "empty", "delete", "append"]),
    at=st.floats(0, 1),
    junk=st.binary(min_size=1, max_size=64),
    command=st.sampled_from(COMMANDS),
)
def test_fuzz_run_directories(
    double_run: Path, which: int, damage: str, at: float, junk: bytes, command: list[str]
) -> None:
    with sandbox() as tmp:
        run = tmp / "run"
        shutil.copytree(double_run, run)
        victims = sorted(p for p in run.rglob("*") if p.is_file())
        victim = victims[which % len(victims)]
        data = victim.read_bytes()
        cut = int(at * len(data))
        if damage == "truncate":
            victim.write_bytes(data[:cut])
        elif damage == "garble":
            victim.write_bytes(data[:cut] + junk + data[cut + len(junk) :])
        elif damage == "empty":
            victim.write_bytes(b"")
        elif damage == "delete":
            victim.unlink()
        else:
            victim.write_bytes(data + junk)
        out = tmp / "out.md"
        argv = [a.format(run=run, good=double_run, out=out) for a in command]
        before = snapshot(tmp)
        code, _, err = run_cli(argv)
        assert_promise(code, err, argv)
        assert snapshot(tmp) - {out} == before, "a file appeared besides the output asked for"


# --- random command lines ------------------------------------------------------------------------


@st.composite
def command_line(draw: st.DrawFn, run: Path, manifest: Path, scratch: Path) -> list[str]:
    verb = draw(st.sampled_from(["run", "report", "compare", "query", "bogus", "", "-h"]))
    values = st.one_of(
        st.sampled_from([str(run), str(run / "run.json"), str(manifest), str(scratch), str(scratch / "missing")]),
        st.sampled_from([str(scratch / "out.html"), str(scratch / "nodir" / "out.md"), "SELECT 1", "SELEC x"]),
        st.sampled_from(["../x", "/abs/x", "a\0b", "x" * 3000, "s3://k:secret@bucket/p", "s3://b/p?secret_key=s"]),
        ODD_TEXT,
        st.text(max_size=20),
    )
    flags = st.sampled_from(
        ["--resume", "--results", "--run-id", "--html", "--markdown", "--gates", "--format", "--tables",
         "--no-progress", "--verbose", "--ray-address", "--check", "--help", "--nope", "-x"]
    )  # fmt: skip
    argv = [verb] if verb else []
    argv += draw(st.lists(st.one_of(flags, values), max_size=6))
    if verb == "run":  # never start Ray: every `run` here is a check
        argv.insert(1, "--check")
    return [a for a in argv if not (a.startswith("-") and a.lstrip("-").startswith("s3"))]


@FUZZ
@given(data=st.data())
def test_fuzz_command_lines(double_run: Path, data: st.DataObject) -> None:
    with sandbox() as tmp:
        scratch = tmp / "scratch"
        scratch.mkdir()
        manifest = scratch / "tiny.yaml"
        shutil.copy(ROOT / "manifests" / "tiny.yaml", manifest)
        argv = data.draw(command_line(double_run, manifest, scratch))
        # An s3:// URI would try the network, except as --results with a secret, refused first.
        if any(a.startswith("s3://") and prev != "--results" for prev, a in itertools.pairwise(["", *argv])):
            return
        before = snapshot(tmp, double_run)
        code, _, err = run_cli(argv)
        assert_promise(code, err, argv)
        created = snapshot(tmp, double_run) - before
        outputs = [v for f, v in itertools.pairwise(argv) if f in ("--html", "--markdown") and "\0" not in v]
        asked = {os.path.normpath(tmp / v) for v in outputs}
        assert {os.path.normpath(p) for p in created} <= asked, f"{argv}: created {created}"


# --- messages name fields as the user wrote them -------------------------------------------------

# pydantic's own location segments: the union member it tried, never a name the user typed.
INTERNALS = ("function-after[", "list[", "union[", "tagged-union[", "json-or-python[", "errors.pydantic.dev")


@settings(FUZZ, max_examples=150)
@given(text=mutated_manifest())
def test_fuzz_messages_never_show_pydantic_internals(text: str) -> None:
    """The same seeded corpus as test_fuzz_manifests (a bounded share of it): every message a
    mutated manifest gets names its field as written (`prompts.p[0].answer`)."""
    with sandbox() as tmp:
        path = tmp / "m.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        _, _, err = run_cli(["run", "--check", str(path), "--results", str(tmp / "results")])
        leaked = [marker for marker in INTERNALS if marker in err]
        assert not leaked, f"{leaked} in:\n{err}"
