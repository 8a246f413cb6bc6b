"""The shipped code reads in small pieces: no function of flows/, stages/ or edge/ is longer
than :data:`MAX_LINES` lines, ``def`` to last line."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80


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


def test_no_shipped_function_is_longer_than_the_limit() -> None:
    shipped = ("flows", "stages", "edge", "physai_core")
    assert [f for d in shipped for f in long_functions(ROOT / d)] == []


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long() -> None:\n{body}\n\ndef short() -> None:\n"
                                      "    pass\n")
    assert long_functions(tmp_path, tmp_path) == [f"long.py:1 long ({MAX_LINES + 1} lines)"]
