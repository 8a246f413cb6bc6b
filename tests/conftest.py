"""Shared fixtures: an isolated state folder per test and the reach pipeline config."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

TinyConfig = Callable[..., Path]


STATE_VARS = ("PHYSAI_STORE", "MLFLOW_TRACKING_URI", "PREFECT_HOME", "PREFECT_API_URL",
              "PHYSAI_MLFLOW_ARTIFACTS")
"""Variables that would point a run at state outside its ``PHYSAI_HOME``."""


@pytest.fixture
def physai_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``PHYSAI_HOME`` with every location under it."""
    home = tmp_path / "physai"
    monkeypatch.setenv("PHYSAI_HOME", str(home))
    for var in STATE_VARS:
        monkeypatch.delenv(var, raising=False)
    return home


CliEnv = Callable[..., dict[str, str]]


@pytest.fixture
def cli_env() -> CliEnv:
    """Environment for a ``flows`` subprocess whose state all lives under ``home``:
    ``cli_env(home, **extra)`` (wide lines, so output can be searched whole)."""

    def make(home: Path, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in STATE_VARS}
        return {**env, "PHYSAI_HOME": str(home), "COLUMNS": "200", **extra}

    return make


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


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` on SQLite for the module; yields its URL."""
    import subprocess
    import sys
    import time
    import urllib.request

    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts")],
        env=env, stdout=subprocess.DEVNULL, stderr=open(root / "server.log", "w"),  # noqa: SIM115
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited: {(root / 'server.log').read_text()[-2000:]}")
    else:
        proc.kill()
        pytest.fail("mlflow server did not become healthy in 120 s")
    yield url
    proc.terminate()
    proc.wait(timeout=30)
