"""Validation scenes fan out to a local Ray instance and report to the flow's one Prefect API."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("prefect_ray")
pytestmark = pytest.mark.e2e


def test_scenes_run_in_ray_workers(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    tiny_config()
    env = {**os.environ, "PHYSAI_HOME": str(tmp_path / ".physai"), "RAY_AUTH_MODE": "disabled"}
    for var in ("MLFLOW_TRACKING_URI", "PHYSAI_STORE", "PREFECT_HOME", "PREFECT_API_URL"):
        env.pop(var, None)
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
