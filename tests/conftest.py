"""Shared fixtures: an isolated state folder per test and the reach pipeline config."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def physai_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``PHYSAI_HOME`` with every location under it."""
    home = tmp_path / "physai"
    monkeypatch.setenv("PHYSAI_HOME", str(home))
    for var in ("PHYSAI_STORE", "MLFLOW_TRACKING_URI", "PREFECT_HOME", "PREFECT_API_URL",
                "PHYSAI_MLFLOW_ARTIFACTS"):
        monkeypatch.delenv(var, raising=False)
    return home


def pytest_configure(config: pytest.Config) -> None:
    """Offscreen rendering through EGL, chosen before anything imports MuJoCo."""
    import os

    os.environ.setdefault("MUJOCO_GL", "egl")
