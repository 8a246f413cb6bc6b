"""The shipped code reads in small pieces: no function of flows/, stages/, edge/ or physai_core/
is longer than :data:`MAX_LINES` lines, ``def`` to last line, and no module longer than
:data:`MAX_FILE_LINES` (but the on-robot runtime, which ships alone in every bundle and is
sectioned on purpose); the top of ``stages/`` and of ``stages/sim/`` holds only concept folders
and the alias modules of promised paths."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
MAX_FILE_LINES = 600
SHIPPED = ("flows", "stages", "edge", "physai_core")
LONG_ON_PURPOSE = frozenset({"edge/runtime.py"})
"""Modules allowed past :data:`MAX_FILE_LINES`, each with its reason: ``edge/runtime.py`` is
the one file a robot runs, copied alone into every bundle."""
ALIASES = {
    "stages": {"algorithms.py", "environments.py", "envrun.py", "launch.py", "mlflow_model.py",
               "train.py", "units.py"},
    "stages/sim": {"batched.py", "locomotion.py", "mujoco_env.py", "reach_arm.py", "scene.py"},
}
"""The modules directly in a concept-folder root: aliases of promised paths
(tests/test_promised_paths.py pins what each names)."""


def long_functions(root: Path, base: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (N lines)`` of every function under ``root`` longer than ``limit``,
    paths relative to ``base``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(base)}:{node.lineno} {node.name} "
                                 f"({length} lines)")
    return found


def long_files(root: Path, base: Path = ROOT, limit: int = MAX_FILE_LINES) -> list[str]:
    """``path (N lines)`` of every module under ``root`` longer than ``limit`` lines, paths
    relative to ``base``, those of :data:`LONG_ON_PURPOSE` left out."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(base).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > limit and name not in LONG_ON_PURPOSE:
            found.append(f"{name} ({lines} lines)")
    return found


def test_no_shipped_function_is_longer_than_the_limit() -> None:
    assert [f for d in SHIPPED for f in long_functions(ROOT / d)] == []


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long() -> None:\n{body}\n\ndef short() -> None:\n"
                                      "    pass\n")
    assert long_functions(tmp_path, tmp_path) == [f"long.py:1 long ({MAX_LINES + 1} lines)"]


def test_no_shipped_module_is_longer_than_the_limit() -> None:
    assert [f for d in SHIPPED for f in long_files(ROOT / d)] == []


def test_the_check_finds_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_FILE_LINES)
    assert long_files(tmp_path, tmp_path) == [f"long.py ({MAX_FILE_LINES + 1} lines)"]


def test_the_roots_hold_only_concept_folders_and_aliases() -> None:
    for root, aliases in ALIASES.items():
        modules = {p.name for p in (ROOT / root).glob("*.py")} - {"__init__.py"}
        assert modules == aliases, f"{root}: {sorted(modules - aliases)} are not aliases"
        folders = {p.name for p in (ROOT / root).iterdir()
                   if p.is_dir() and p.name != "__pycache__"}
        assert all((ROOT / root / f / "__init__.py").is_file() for f in folders), folders
        for folder in folders:
            doc = ast.get_docstring(ast.parse((ROOT / root / folder / "__init__.py").read_text()))
            assert doc, f"{root}/{folder}/__init__.py says nothing of what lives there"
