"""locomotion-v0 on Isaac Lab in a pipeline: a suite with ``backend: isaaclab`` validates the
quadruped (floor contacts on Newton) in the isaaclab stage environment, with MuJoCo as its
``compare_backend``; the report holds both simulators' rates and their agreement test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.conftest import CliEnv
from tests.support import run_flows

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
SCENES = ROOT / "sim_scenes" / "locomotion"


def test_locomotion_validates_on_isaaclab_and_agrees_with_mujoco(
    cli_env: CliEnv, tmp_path: Path
) -> None:
    from stages.core.environments import get_environment
    from stages.storage.store import LocalStore

    if not os.access(get_environment("isaaclab").python(), os.X_OK):
        pytest.skip("the isaaclab stage environment is not built: make isaaclab")
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "name: locomotion-sim2sim\ntask: locomotion-v0\nbackend: isaaclab\n"
        "compare_backend: mujoco\nscenes:\n"
        f"  - {{scene: {SCENES / 'flat.yaml'}, episodes: 20, seed: 1000}}\n"
        f"  - {{scene: {SCENES / 'low_friction.yaml'}, episodes: 20, seed: 3000}}\n")
    config = yaml.safe_load((ROOT / "configs" / "locomotion_scripted.yaml").read_text())
    config["collect"].update(scene=str(SCENES / "collect.yaml"), episodes=80, num_worlds=80)
    config["train"]["epochs"] = 8
    config["validate"] = {"suite": str(suite), "min_success": 0.5, "video_episodes": 1,
                          "sim_to_sim": {"gate": True}}
    config["name"] = config["promote"]["model_name"] = "locomotion-isaaclab"
    path = tmp_path / "locomotion.yaml"
    path.write_text(yaml.safe_dump(config))
    home = tmp_path / ".physai"
    done = run_flows("run", str(path), cwd=tmp_path, env=cli_env(home))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for scene in ("flat", "low_friction"):
        assert f"[isaaclab] validate {scene} 20/20" in done.stderr, done.stderr[-3000:]
    store = LocalStore(home / "store")
    (report,) = [r for r in (store.get(m.stem) for m in (home / "store" / "artifacts")
                             .glob("*.json")) if r.kind == "sim_report"]
    assert report.backend == "isaaclab" and report.backend_version.split(" ")[1].startswith(
        "newton-")
    check = report.sim_to_sim
    assert check is not None and check.backend == "mujoco"
    rates = {s.scene: (s.success_rate, o.success_rate)
             for s, o in zip(report.scenes, check.scenes, strict=True)}
    print(f"locomotion BC policy, Isaac Lab vs MuJoCo: {rates}")
    assert all(isaac >= 0.5 for isaac, _ in rates.values()), rates  # it walks on Newton's floor
    assert check.agrees, check.agreement
    assert all(s.usd_digest for s in report.scenes)  # Isaac Lab's rollouts as USD stages
