"""Validation scenes fan out to a local Ray instance and report to the flow's one Prefect API."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("prefect_ray")
CliEnv = Callable[..., dict[str, str]]

pytestmark = pytest.mark.e2e


def test_scenes_run_in_ray_workers(
    tmp_path: Path, tiny_config: Callable[..., Path], cli_env: CliEnv
) -> None:
    tiny_config()
    env = cli_env(tmp_path / ".physai", shared_prefect=False, RAY_AUTH_MODE="disabled")
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "pipeline.yaml", "--task-runner", "ray"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    scenes = set(re.findall(
        r"\(validate-scene pid=\d+\).*Task run 'validate-(\w+)' - Finished in state Completed",
        out))
    assert scenes == {"nominal", "heavy_payload", "noisy_sensors"}
    assert out.count("Starting temporary server") == 1, "workers must use the flow's API"
    assert "models:/reach-tiny/1 -> @champion" in out


def test_worker_environment_carries_the_drivers_settings_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.runners import worker_environment

    monkeypatch.chdir(tmp_path)
    env = {"PHYSAI_HOME": "state", "PREFECT_API_URL": "http://10.0.0.5:4200/api",
           "MLFLOW_S3_ENDPOINT_URL": "http://10.0.0.6:9000", "MUJOCO_GL": "egl",
           "PHYSAI_POLICY_API_KEY": "k", "AWS_SECRET_ACCESS_KEY": "s",
           "PREFECT_API_KEY": "p", "HOME": "/root", "PATH": "/usr/bin"}
    travel = worker_environment(env)
    home = tmp_path / "state"
    assert travel["PHYSAI_HOME"] == str(home)
    assert travel["PHYSAI_STORE"] == str(home / "store")
    assert travel["MLFLOW_TRACKING_URI"] == f"sqlite:///{home / 'mlflow.db'}"
    assert travel["PREFECT_HOME"] == str(home / "prefect")
    assert travel["PREFECT_LOCAL_STORAGE_PATH"] == str(home / "prefect" / "storage")
    assert travel["PREFECT_API_URL"] == env["PREFECT_API_URL"]
    assert travel["MLFLOW_S3_ENDPOINT_URL"] == env["MLFLOW_S3_ENDPOINT_URL"]
    assert travel["MUJOCO_GL"] == "egl"
    for kept in ("PHYSAI_POLICY_API_KEY", "AWS_SECRET_ACCESS_KEY", "PREFECT_API_KEY", "HOME",
                 "PATH"):
        assert kept not in travel


def test_worker_environment_keeps_an_s3_store_and_a_server() -> None:
    from flows.runners import worker_environment

    env = {"PHYSAI_HOME": "/srv/physai", "PHYSAI_STORE": "s3://bucket/prefix",
           "MLFLOW_TRACKING_URI": "http://mlflow:5000"}
    travel = worker_environment(env)
    assert travel["PHYSAI_STORE"] == "s3://bucket/prefix"
    assert travel["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"


def test_tasks_run_on_their_stages_computer() -> None:
    from flows.runners import NoNodeError, task_computer

    assert task_computer("validate-scene") == "ovx"
    assert task_computer("train") == "dgx"
    assert task_computer("start-run") is None
    message = str(NoNodeError("validate", "ovx"))
    assert "\n" not in message
    assert message.startswith("validate: no live Ray node offers the resource 'ovx' (the ovx pool)")
