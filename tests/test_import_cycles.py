"""No import circle in the shipped code, type-only imports included.

import-linter's contracts skip imports under ``if TYPE_CHECKING:`` and only compare siblings;
a reader follows every import. This test parses every ``import`` statement of every module of
:data:`SHIPPED` (module level, function level and type-only alike), resolves each to the
project module it names (``from pkg import name`` where ``name`` is a submodule imports the
submodule) and looks for a circle in that graph; every circle found is printed with the file
and line of each of its imports.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("physai_core", "stages", "flows", "edge")
"""The packages whose imports may not close a circle."""


@dataclass(frozen=True)
class Import:
    """One imported module as a statement names it."""

    source: str
    """The importing module."""
    path: Path
    line: int
    module: str
    """The module named, relative imports resolved (``from X import a`` names ``X``)."""
    names: tuple[str, ...]
    """What ``from X import ...`` takes from it; empty for ``import X``."""

    def where(self, base: Path = ROOT) -> str:
        """``path:line`` of the statement, the path relative to ``base`` where it can be."""
        path = self.path.relative_to(base) if self.path.is_relative_to(base) else self.path
        return f"{path}:{self.line}"


def project_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted name to file of every module of ``packages`` under ``root`` (a package is its
    ``__init__.py``)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(module: str, path: Path) -> list[Import]:
    """Every import statement anywhere in ``path`` (the module ``module``), in file order."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module, path, node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            found.append(Import(module, path, node.lineno, base,
                                tuple(alias.name for alias in node.names)))
    return sorted(found, key=lambda i: i.line)


def resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The project module ``name`` is or lies in (its longest dotted prefix that is one)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def targets(imp: Import, modules: Mapping[str, Path]) -> list[str]:
    """The project modules one import statement imports: a submodule taken by
    ``from pkg import sub`` counts as the submodule."""
    if not imp.names:
        found = resolve(imp.module, modules)
        return [found] if found else []
    out: list[str] = []
    for name in imp.names:
        found = (f"{imp.module}.{name}" if f"{imp.module}.{name}" in modules
                 else resolve(imp.module, modules))
        if found and found not in out:
            out.append(found)
    return out


def import_graph(modules: Mapping[str, Path]) -> dict[str, dict[str, Import]]:
    """Module to the project modules it imports, each with the first statement that does."""
    graph: dict[str, dict[str, Import]] = {}
    for module, path in modules.items():
        edges: dict[str, Import] = {}
        for imp in imports_of(module, path):
            for target in targets(imp, modules):
                if target != module:
                    edges.setdefault(target, imp)
        graph[module] = edges
    return graph


def strongly_connected(graph: Mapping[str, Mapping[str, Import]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one module (Tarjan's
    algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    parts.append(sorted(part))
    return sorted(parts)


def shortest_cycle(graph: Mapping[str, Mapping[str, Import]], part: list[str]) -> list[str]:
    """The shortest circle through the first module of ``part`` inside it, first module
    repeated at the end."""
    start, inside = part[0], set(part)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [*reversed(path), start]
                if child in inside and child not in came:
                    came[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{part} is not strongly connected")


def cycles(root: Path, packages: Iterable[str]) -> list[str]:
    """One line per circle of imports among ``packages`` under ``root``: its shortest circle
    through one module, each import with its file and line, and the modules the circle's
    strongly connected part holds."""
    graph = import_graph(project_modules(root, packages))
    out = []
    for part in strongly_connected(graph):
        cycle = shortest_cycle(graph, part)
        steps = [f"{a} -> {b} ({graph[a][b].where(root)})"
                 for a, b in itertools.pairwise(cycle)]
        out.append(f"circle of {len(part)} modules {part}: " + "; ".join(steps))
    return out


def test_shipped_code_imports_in_no_circle() -> None:
    found = cycles(ROOT, SHIPPED)
    assert not found, "import circles:\n" + "\n".join(found)


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_type_only_circle_is_found(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from pkg.high import High\n",
        "pkg/high.py": "from pkg import low\n",
        "pkg/apart.py": "import pkg.low\n",
    })
    assert cycles(tmp_path, ["pkg"]) == [
        "circle of 2 modules ['pkg.high', 'pkg.low']: pkg.high -> pkg.low (pkg/high.py:1); "
        "pkg.low -> pkg.high (pkg/low.py:3)"]


def test_a_function_level_relative_circle_is_found(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "from .b import B\n",
        "pkg/sub/b.py": "B = 1\n\ndef f() -> None:\n    from ..c import g\n",
        "pkg/c.py": "def g() -> None:\n    from pkg.sub import B\n",
    })
    found = cycles(tmp_path, ["pkg"])
    assert len(found) == 1
    assert found[0].startswith("circle of 3 modules ['pkg.c', 'pkg.sub', 'pkg.sub.b']: "
                               "pkg.c -> pkg.sub (pkg/c.py:2); ")


def test_imports_without_a_circle_pass(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import os\nfrom pkg import b\nfrom pkg.b import x\n",
        "pkg/b.py": "x = 1\n",
        "pkg/c.py": "from . import a, b\n",
    })
    assert cycles(tmp_path, ["pkg"]) == []
