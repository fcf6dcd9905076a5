"""The shape of the house, read from the code: DESIGN.md's import rules, no cycles, sizes.

Every import counts, lazy ones inside functions and TYPE_CHECKING ones included: a module that
imports another only for a type still depends on it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "distill"

# DESIGN.md, "Arrows that must never exist": (importer, imported) top-level units of distill/.
NEVER = [
    ("methods", "cli"),
    ("domains", "methods"),
    ("engines", "methods"),
    ("tracking", "methods"),
    ("diagnose", "methods"),
    ("diagnose", "runner"),
    ("domains", "tracking"),
    ("tokenizer_bridge", "methods"),
    ("episodes", "methods"),
    ("config", "domains"),
    ("config", "engines"),
    ("config", "evals"),
    # The kernels sit below both the methods and the engines.
    ("kernels", "methods"),
    ("kernels", "engines"),
]
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "distill" and len(parts) > 1 else None


def imported_modules(path: Path, tree: ast.AST) -> list[tuple[str, int]]:
    """(module, line) of every import in the file, relative imports resolved."""
    rel = path.relative_to(ROOT.parent).with_suffix("")
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel.parts[: len(rel.parts) - node.level])
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((module, node.lineno))
            out += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
    return out


def unit_edges() -> dict[str, dict[str, list[str]]]:
    """unit -> imported unit -> ["file:line", ...]."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        me = unit(".".join(rel.parts))
        for module, line in imported_modules(path, ast.parse(path.read_text())):
            other = unit(module)
            if me and other and other != me:
                edges[me][other].append(f"{path.relative_to(ROOT.parent)}:{line}")
    return edges


def cycles(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Strongly connected components of more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_lazy_and_type_only_imports(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from distill.methods.context import RunContext\n"
        "def f():\n    from distill.cli import app\n    from . import sibling\n"
    )
    path = ROOT / "engines" / "probe.py"
    modules = [m for m, _ in imported_modules(path, ast.parse(source))]
    assert "distill.methods.context" in modules and "distill.cli" in modules
    assert "distill.engines" in modules  # `from . import sibling` inside engines/
    assert cycles({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}) == [["a", "b", "c"]]


def test_no_never_arrow() -> None:
    edges = unit_edges()
    broken = {f"{a} -> {b}": edges[a][b] for a, b in NEVER if b in edges.get(a, {})}
    assert not broken, broken


def test_no_cycle_between_top_level_units() -> None:
    assert cycles(unit_edges()) == []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def file_edges() -> dict[str, dict[str, list[str]]]:
    """module -> imported module of distill -> ["file:line", ...], file by file (a package's
    `__init__` counts as its own file; an import of a module's own package does not count)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for me, path in modules.items():
        for module, line in imported_modules(path, ast.parse(path.read_text())):
            other = resolve(module) if module.startswith("distill") else None
            if other and other not in (me, "distill") and not me.startswith(other + "."):
                edges[me][other].append(f"{path.relative_to(ROOT.parent)}:{line}")
    return edges


def test_no_file_level_cycle() -> None:
    """No two files import each other, directly or round a loop: lazy imports only hide a cycle."""
    assert cycles(file_edges()) == []


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_file_and_function_sizes(path: Path) -> None:
    source = path.read_text()
    assert source.count("\n") <= MAX_FILE_LINES, f"{path}: over {MAX_FILE_LINES} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path}: {long}"
