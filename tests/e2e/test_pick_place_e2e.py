"""Manipulation through the config door: ``flows run`` of a tiny pick-place pipeline collects
from the grasp expert, clones it, validates, packages and registers; ``flows validate --json``
of the registered model says why each failed episode failed, in the task's words (the ranking
of the object's factors is tests/stages/sim/test_manipulation.py's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stages.sim.tasks.manipulation import FAILURE_MODES
from tests.support import run_flows

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def test_a_pick_place_pipeline_runs_and_its_failures_are_explained(tmp_path: Path) -> None:
    env = {**os.environ, "PHYSAI_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    done = run_flows("run", str(ROOT / "tests" / "fixtures" / "pick_place_tiny.yaml"),
                     env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "models:/pick-place-tiny/1" in done.stdout
    (tmp_path / "suite.yaml").write_text(
        "name: heavy\ntask: pick-place-v0\nscenes:\n"
        f"  - {{scene: {ROOT}/sim_scenes/pick_place/heavy.yaml, episodes: 12, seed: 7}}\n")
    done = run_flows("validate", "models:/pick-place-tiny/1", "--suite", "suite.yaml", "--json",
                     "--min-success", "0", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (scene,) = json.loads(done.stdout)["scenes"]
    failed = scene["episodes"] - scene["successes"]
    assert failed > 0 and sum(scene["failure_modes"].values()) == failed
    assert set(scene["failure_modes"]) <= set(FAILURE_MODES), scene["failure_modes"]
    assert len(scene["outcomes"]) == scene["episodes"] == 12
