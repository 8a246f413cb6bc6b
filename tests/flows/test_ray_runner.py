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
