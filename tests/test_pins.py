"""Dependency pins that keep a known flaw out: the declared ranges, and what is installed."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
FLAWED = {"pyarrow": ["14.0.0", "13.0.0"]}
"""Releases with a known code-execution flaw: pyarrow's Parquet reader before 14.0.1
(CVE-2023-47248), which reads the episode records and LeRobot datasets."""


@pytest.mark.parametrize("name", sorted(FLAWED))
def test_no_flawed_release_is_admitted(name: str) -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(r) for r in declared if Requirement(r).name == name]
    admitted = [v for v in FLAWED[name] if req.specifier.contains(v, prereleases=True)]
    assert admitted == [], f"{req} admits {admitted}"
    assert Version(version(name)) not in {Version(v) for v in FLAWED[name]}
