"""Validation scenes fan out to a local Ray instance and report to the flow's one Prefect API."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("prefect_ray")
pytestmark = pytest.mark.e2e


def test_scenes_run_in_ray_workers(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "tests" / "fixtures" / "reach_tiny.yaml").read_text())
    config["collect"].update(scene=str(ROOT / "sim_scenes" / "reach" / "collect.yaml"),
                             episodes=40)
    config["train"]["epochs"] = 5
    config["validate"]["suite"] = str(ROOT / "tests" / "fixtures" / "suite_tiny.yaml")
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
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
