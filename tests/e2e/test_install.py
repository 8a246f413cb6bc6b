"""physai-flows installed like a library (a wheel, not editable) runs a tiny config from an
empty folder: scenes and model files resolve through the installed package, never the checkout.
The venv is tests/e2e/conftest.py's ``installed``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.support import run_captured as run

ROOT = Path(__file__).resolve().parents[2]

CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e


def test_wheel_install_runs_a_tiny_config_from_an_empty_folder(
    installed: Path, tmp_path: Path, cli_env: CliEnv
) -> None:
    work = tmp_path / "empty"
    work.mkdir()
    config = {
        "name": "installed", "task": "reach-v0", "seed": 0,
        "collect": {"scene": "pkg:sim_scenes/reach/collect.yaml", "episodes": 20,
                    "num_worlds": 10},
        "train": {"epochs": 3, "hidden": [32, 32], "device": "cpu"},
        "validate": {"suite": "pkg:sim_scenes/reach/suite.yaml", "min_success": 0.0,
                     "video_episodes": 0},
        "package": {"latency_iters": 50},
        "promote": {"model_name": "installed"},
    }
    (work / "pipeline.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in cli_env(work / ".physai").items() if k != "PYTHONPATH"}
    where = run([str(installed / "python"), "-c",
                  "import stages.sim.tasks.reach as r, sim_scenes, edge; "
                  "print(r.__file__); print(r.ARM7_XML); print(sim_scenes.__path__[0])"],
                 cwd=work, env=env)
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert not Path(line).is_relative_to(ROOT), where.stdout
        assert Path(line).exists(), line
    done = run([str(installed / "flows"), "run", "pipeline.yaml"], cwd=work, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "wide_targets" in done.stdout and "models:/installed/1" in done.stdout, done.stdout
    assert sorted(os.listdir(work)) == [".physai", "pipeline.yaml"]
