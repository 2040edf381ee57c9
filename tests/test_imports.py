"""The import graph: `import fleet` (and everything the driver loads) must not pull in torch, vllm
or transformers, and no module of fleet/ or actors/ imports one that imports it back."""

import ast
import subprocess
import sys
from pathlib import Path

import actors
import fleet

HEAVY = ("torch", "vllm", "transformers")


def test_driver_side_imports_are_light() -> None:
    code = (
        "import sys, fleet, fleet.cli, fleet.run.manifest, fleet.run.plan, fleet.run.driver, fleet.run.scheduler, "
        "fleet.results.store, fleet.analysis.parity, fleet.report.text, fleet.report.html, "
        "fleet.report.markdown, fleet.report.compare, actors, "
        "actors.target_actor, actors.sources;"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout.strip()}"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules one import statement names: `from a import b` names a.b when that is a
    module (else a), relative imports resolved against `module`."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - node.level + 1]
        base = ".".join([*anchor, *([base] if base else [])])
    named = {f"{base}.{a.name}" for a in node.names} & known
    return named or ({base} & known)


def _import_graph(roots: list[Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its file: at module level, under
    `if TYPE_CHECKING:` and inside functions alike (any of them closes a circle for a reader)."""
    files = {_module_name(f, root): f for root in roots for f in root.rglob("*.py")}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        imports = (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))
        is_package = path.name == "__init__.py"
        graph[module] = set().union(*(_imported(n, module, is_package, known) for n in imports)) - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component (Tarjan), each as a path back to its start."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while (w := stack.pop()) != v:
                component.add(w)
            components.append(component | {v})

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, c) for c in components if len(c) > 1]


def _circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(component)


def test_no_import_circles() -> None:
    """No module imports one that imports it back, through any path and any kind of import: the
    import linter's layers check packages against each other, not the modules inside one package."""
    roots = [Path(fleet.__file__).parent, Path(actors.__file__).parent]
    cycles = _cycles(_import_graph(roots))
    shown = "\n".join(" -> ".join(c) for c in cycles)
    assert not cycles, f"import circles in {', '.join(map(str, roots))}:\n{shown}"


def test_circles_through_type_checking_and_function_imports_are_found(tmp_path: Path) -> None:
    """The check is not vacuous: a circle closed only by a TYPE_CHECKING import, a function's
    import or a relative import is still a circle."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("from ..a import f\n")
    (pkg / "d.py").write_text("import pkg.a\n")  # into the circle, not part of it
    assert _cycles(_import_graph([pkg])) == [["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]]
