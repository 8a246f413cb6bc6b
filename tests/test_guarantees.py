"""docs/guarantees.md lists a promise only with the tests that prove it: every test file and
test it names exists (``file::test`` names a test of that file; ``::test`` one of the file
named before it in the same cell; a parametrized test by its function's name)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guarantees.md"
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`")


def references(cell: str) -> list[tuple[str, str | None]]:
    """The (file, test) pairs a "proved by" cell names, in order."""
    found: list[tuple[str, str | None]] = []
    current: str | None = None
    for match in REFERENCE.finditer(cell):
        file, test = match.groups()
        current = file or current
        if current is not None and (file or test):
            found.append((current, test))
    return found


def test_every_test_the_guarantees_name_exists() -> None:
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith("| **")]
    assert len(rows) >= 40
    missing: list[str] = []
    named = 0
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        for file, test in references(cells[-1]):
            named += 1
            path = ROOT / file
            if not path.is_file():
                missing.append(file)
            elif test and not re.search(rf"^\s*(async )?def {test}\(", path.read_text(), re.M):
                missing.append(f"{file}::{test}")
    assert named >= 100
    assert missing == [], missing


def test_a_test_that_is_not_there_is_found() -> None:
    cell = ("`tests/test_guarantees.py::test_every_test_the_guarantees_name_exists`, "
            "`::test_no_such_test`; `tests/no_such_file.py`")
    assert references(cell) == [
        ("tests/test_guarantees.py", "test_every_test_the_guarantees_name_exists"),
        ("tests/test_guarantees.py", "test_no_such_test"),
        ("tests/no_such_file.py", None)]
