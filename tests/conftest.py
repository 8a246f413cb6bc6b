"""Shared fixtures: an isolated state folder per test and the reach pipeline config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

TinyConfig = Callable[..., Path]


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


@pytest.fixture
def tiny_config(tmp_path: Path) -> TinyConfig:
    """Write a very small reach pipeline config (40 episodes, 5 epochs, 3 scenes) with the given
    per-section overrides; returns its path."""

    def write(name: str = "pipeline.yaml", **sections: dict[str, object]) -> Path:
        data = yaml.safe_load((FIXTURES / "reach_tiny.yaml").read_text())
        data["collect"].update(scene=str(ROOT / "sim_scenes" / "reach" / "collect.yaml"),
                               episodes=40)
        data["train"]["epochs"] = 5
        data["validate"]["suite"] = str(FIXTURES / "suite_tiny.yaml")
        for section, values in sections.items():
            data[section].update(values)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data))
        return path

    return write
