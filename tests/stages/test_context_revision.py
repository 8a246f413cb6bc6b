"""The code revision every artifact's producer records
(stages.orchestration.context.code_revision)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stages.orchestration.context import CODE_REVISION_VARIABLE, code_revision

ROOT = Path(__file__).resolve().parents[2]


def test_an_image_names_the_commit_it_was_built_from(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.delenv(CODE_REVISION_VARIABLE, raising=False)
    here = code_revision()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert here.removesuffix("+dirty") == head
    # In an image the project's files come without .git: the build's revision is set.
    monkeypatch.setenv(CODE_REVISION_VARIABLE, "0123abcd")
    assert code_revision() == "0123abcd"
    # A checkout named explicitly is asked itself; a folder without git gives the version.
    assert code_revision(ROOT) == here
    assert code_revision(tmp_path).startswith("physai-flows==")
