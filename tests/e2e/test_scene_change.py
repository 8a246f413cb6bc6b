"""Editing one validation scene re-runs that scene and what follows it, nothing before."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

CliEnv = Callable[..., dict[str, str]]

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def test_changed_scene_reruns_only_that_scene_onward(tmp_path: Path, cli_env: CliEnv) -> None:
    scenes = tmp_path / "scenes"
    shutil.copytree(ROOT / "sim_scenes" / "reach", scenes)
    config = yaml.safe_load((ROOT / "tests" / "fixtures" / "reach_tiny.yaml").read_text())
    config["collect"].update(scene=str(scenes / "collect.yaml"), episodes=40)
    config["train"]["epochs"] = 5
    config["validate"]["suite"] = "suite.yaml"
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    suite = yaml.safe_load((ROOT / "tests" / "fixtures" / "suite_tiny.yaml").read_text())
    for entry in suite["scenes"]:
        entry["scene"] = str(scenes / Path(entry["scene"]).name)
        entry["episodes"] = 10
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))

    env = cli_env(tmp_path / ".physai")

    def run() -> str:
        proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", "pipeline.yaml"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    run()
    noisy = scenes / "noisy_sensors.yaml"
    noisy.write_text(noisy.read_text().replace("obs_noise_std: 0.005", "obs_noise_std: 0.004"))
    out = run()
    assert "cached stages: collect, train\n" in out
    cached = set(re.findall(r"Task run 'validate-(\w+)' - Finished in state Cached", out))
    assert cached == {"nominal", "heavy_payload"}
    assert re.search(r"Task run 'validate-noisy_sensors' - Finished in state Completed", out)
