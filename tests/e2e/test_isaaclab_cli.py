"""Isaac Lab from the command line: ``flows validate models:/NAME@champion --suite S`` with
``backend: isaaclab`` in S evaluates the champion in the Isaac Lab stage environment (as a
pipeline's validate stage does), ``flows compare`` evaluates both of its policies there, and a
pipeline whose ``train.source`` is that champion validates there too. ``make test`` builds
the environment first; elsewhere the test skips without it."""

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
MODEL = "reach-crash"
"""The model crash_micro.yaml promotes (its gate is 0: every run promotes)."""


def test_the_champion_validates_on_isaaclab_from_the_cli_and_as_a_pipeline_source(
    cli_env: CliEnv, tmp_path: Path
) -> None:
    from stages.environments import get_environment

    if not os.access(get_environment("isaaclab").python(), os.X_OK):
        pytest.skip("the isaaclab stage environment is not built: make isaaclab")
    env = cli_env(tmp_path / ".physai")
    trained = run_flows("run", str(ROOT / "tests" / "fixtures" / "crash_micro.yaml"),
                        cwd=tmp_path, env=env, timeout=600)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert f"models:/{MODEL}/1 -> @champion" in trained.stdout, trained.stdout[-3000:]
    suite = tmp_path / "suite_isaaclab.yaml"
    suite.write_text(
        "name: reach-on-isaaclab\ntask: reach-v0\nbackend: isaaclab\nscenes:\n"
        f"  - {{scene: {ROOT / 'sim_scenes' / 'reach' / 'nominal.yaml'}, episodes: 3, "
        "seed: 7}\n")

    done = run_flows("validate", f"models:/{MODEL}@champion", "--suite", str(suite), "--json",
                     "--min-success", "0", cwd=tmp_path, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[isaaclab] validate nominal 3/3" in done.stderr, done.stderr[-3000:]
    body = json.loads(done.stdout)
    assert body["policy_kind"] == "registry" and body["suite"] == "reach-on-isaaclab"
    (scene,) = body["scenes"]
    assert scene["episodes"] == 3 and len(scene["outcomes"]) == 3
    assert body["passed"] and body["mlflow_run_id"]
    # Both policies of a comparison run in one interpreter of the environment, on the same
    # episodes: the champion against its own version is not worse, scene by scene equal.
    compared = run_flows("compare", f"models:/{MODEL}@champion", f"models:/{MODEL}/1",
                         "--suite", str(suite), "--json", cwd=tmp_path, env=env, timeout=900)
    assert compared.returncode == 0, compared.stdout[-3000:] + compared.stderr[-3000:]
    assert compared.stderr.count("[isaaclab] validate nominal 3/3") == 2, compared.stderr[-3000:]
    verdict = json.loads(compared.stdout)
    assert verdict["worse"] is False and verdict["suite"] == "reach-on-isaaclab"
    (same,) = verdict["comparison"]["scenes"]
    assert same["difference"] == 0.0 and same["champion_successes"] == scene["successes"]

    config = {
        "name": "reach-from-champion", "task": "reach-v0",
        "train": {"source": f"models:/{MODEL}@champion"},
        "validate": {"suite": str(suite), "min_success": 0.0, "video_episodes": 0},
        "package": {"latency_iters": 50, "max_latency_p99_ms": 20},
        "promote": {"model_name": "reach-from-champion"},
    }
    (tmp_path / "from_champion.yaml").write_text(yaml.safe_dump(config))
    piped = run_flows("run", "from_champion.yaml", cwd=tmp_path, env=env, timeout=900)
    assert piped.returncode == 0, piped.stdout[-3000:] + piped.stderr[-3000:]
    assert "[isaaclab] validate nominal 3/3" in piped.stderr, piped.stderr[-3000:]
    assert "models:/reach-from-champion/1 -> @champion" in piped.stdout, piped.stdout[-3000:]
