"""An Isaac Lab-registered task in a pipeline: ``task: isaaclab:Isaac-Cartpole-Direct-v0``
trains with rsl_rl's PPO and validates in the isaaclab stage environment (configs/
isaaclab_cartpole.yaml), packages with observations met there, and is promoted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.conftest import CliEnv
from tests.support import run_flows

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_isaaclab_cartpole_trains_validates_and_is_promoted(
    cli_env: CliEnv, tmp_path: Path
) -> None:
    from stages.core.environments import get_environment
    from stages.storage.store import LocalStore

    if not os.access(get_environment("isaaclab").python(), os.X_OK):
        pytest.skip("the isaaclab stage environment is not built: make isaaclab")
    config = yaml.safe_load((ROOT / "configs" / "isaaclab_cartpole.yaml").read_text())
    config["train"]["scene"] = str(ROOT / "configs" / config["train"]["scene"])
    # The wiring, not the learning, on make test's clock: 15 iterations of 512 worlds, not the
    # config's 150 of 2048 (which balance 50/50 episodes), and no bar to pass. The suite's
    # scene, which validation and the package's observations each run for one episode, is
    # the nominal one cut to 60 of its 300 steps: an Isaac Lab step costs about the same for
    # 50 worlds as for 2048, so the episode's length is their time.
    config["train"].update(iterations=15, num_worlds=512, checkpoint_every=10)
    suite = yaml.safe_load((ROOT / "configs" / config["validate"]["suite"]).read_text())
    (entry,) = suite["scenes"]
    scene = yaml.safe_load((ROOT / "sim_scenes" / "isaaclab_cartpole" / entry["scene"])
                           .read_text())
    (tmp_path / "nominal.yaml").write_text(yaml.safe_dump({**scene, "episode_steps": 60}))
    suite["scenes"] = [{**entry, "scene": str(tmp_path / "nominal.yaml")}]
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    config["validate"].update(suite=str(tmp_path / "suite.yaml"), min_success=0.0)
    path = tmp_path / "cartpole.yaml"
    path.write_text(yaml.safe_dump(config))
    home = tmp_path / ".physai"
    done = run_flows("run", str(path), cwd=tmp_path, env=cli_env(home))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[isaaclab] train: PPO policy" in done.stderr, done.stderr[-3000:]
    assert "[isaaclab] validate nominal 50/50" in done.stderr, done.stderr[-3000:]
    assert "[isaaclab] train 15/15" in done.stderr, done.stderr[-3000:]
    assert "models:/isaaclab-cartpole/1 -> @champion" in done.stdout, done.stdout[-3000:]
    store = LocalStore(home / "store")
    records = [store.get(m.stem) for m in (home / "store" / "artifacts").glob("*.json")]
    kinds = {r.kind: r for r in records}
    policy, report = kinds["policy"], kinds["sim_report"]
    assert policy.task == "isaaclab:Isaac-Cartpole-Direct-v0" and policy.algorithm == "ppo"
    assert report.backend == "isaaclab" and report.passed
    (scene,) = report.scenes
    assert scene.backend == "isaaclab" and scene.episodes == 50
    bundle = kinds["edge_bundle"]
    assert bundle.passed and bundle.parity_max_abs_diff <= 1e-5
    print(json.dumps({"cartpole": f"{scene.successes}/{scene.episodes}",
                      "ci_low": round(scene.ci_low, 3)}))
