"""The manipulation benchmarks in their own stage environments (make metaworld, make
gymnasium-robotics), through the command line and the config door:

- ``flows validate`` of MetaWorld's scripted policies (Python code) on a ten-task suite gives,
  episode by episode, the outcome MetaWorld's own loop gives with the same seeds and task
  placements (tests/fixtures/benchmarks/metaworld_loop.py, which uses nothing of this project).
  The episodes are cut near the policies' median time to success, so the outcomes depend on the
  placement each episode ran: a broken seeding (every world made alike) disagrees.
- Gymnasium-Robotics' Fetch pick-and-place validates there with a Python phase controller.
(tests/e2e/test_benchmark_pipeline_e2e.py runs a pipeline there.)
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import run_flows

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "benchmarks"
EXPERTS = "python:stages.sim.tasks.benchmark_experts"

pytestmark = pytest.mark.e2e


def _python(environment: str) -> Path:
    from stages.core.environments import get_environment

    python = get_environment(environment).python()
    if not os.access(python, os.X_OK):
        pytest.skip(f"the {environment} stage environment is not built: make {environment}")
    return python


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PHYSAI_HOME": str(tmp_path / "home"), "COLUMNS": "200"}


def test_metaworld_scripted_policies_agree_per_episode_with_metaworlds_own_loop(
        tmp_path: Path) -> None:
    python = _python("metaworld")
    suite = FIXTURES / "mt10_short.yaml"
    reference = subprocess.Popen(  # MetaWorld's own loop, beside the validation
        [str(python), "-W", "ignore", str(FIXTURES / "metaworld_loop.py"), str(suite)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    done = run_flows("validate", f"{EXPERTS}:metaworld_scripted", "--suite", str(suite),
                     "--trust-code", "--json", "--min-success", "0", env=_env(tmp_path),
                     cwd=tmp_path)
    own_out, own_err = reference.communicate(timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert reference.returncode == 0, own_err[-3000:]
    body = json.loads(done.stdout)
    ours = {s["name"]: s["outcomes"] for s in body["scenes"]}
    theirs = json.loads(own_out)
    assert len(ours) == 10 and ours == theirs
    outcomes = "".join(theirs.values())
    assert "0" in outcomes and "1" in outcomes  # the cut episodes decide something
    summary = body["summary"]
    assert summary["scenes"] == 10 and summary["episodes"] == 60
    assert summary["successes"] == outcomes.count("1")
    assert body["task"] == "gymnasium:metaworld:Meta-World/MT1"


def test_fetch_pick_and_place_validates_in_its_environment_with_a_python_expert(
        tmp_path: Path) -> None:
    _python("gymnasium-robotics")
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "name: fetch-tiny\ntask: gymnasium:gymnasium_robotics:FetchPickAndPlace-v4\n"
        "backend: gymnasium-robotics\nscenes:\n"
        f"  - {{scene: {ROOT}/sim_scenes/fetch/pick_and_place.yaml, episodes: 12, seed: 3}}\n")
    verdicts = {}
    for ref in (f"{EXPERTS}:fetch_pick_and_place", f"{EXPERTS}:metaworld_scripted"):
        done = run_flows("validate", ref, "--suite", str(suite), "--trust-code", "--json",
                         env=_env(tmp_path), cwd=tmp_path)
        verdicts[ref] = (done.returncode, done.stdout, done.stderr)
    code, out, err = verdicts[f"{EXPERTS}:fetch_pick_and_place"]
    assert code == 0, err[-3000:]
    (scene,) = json.loads(out)["scenes"]
    assert scene["successes"] >= 11, scene
    # MetaWorld's experts are not Fetch's: the scene names no env_name, and that is said
    code, out, err = verdicts[f"{EXPERTS}:metaworld_scripted"]
    assert code != 0 and "metaworld" in err.lower()


def test_a_benchmark_without_its_environment_is_one_line_naming_the_make_target(
        tmp_path: Path) -> None:
    env = {**_env(tmp_path), "PHYSAI_ENV_METAWORLD_PYTHON": str(tmp_path / "no" / "python")}
    done = run_flows("validate", f"{EXPERTS}:metaworld_scripted", "--suite",
                     str(ROOT / "sim_scenes" / "metaworld" / "mt10.yaml"), "--trust-code",
                     env=env, cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line == (f"flows: error: task gymnasium:metaworld:Meta-World/MT1: stage environment "
                    f"'metaworld' is not built ({tmp_path / 'no' / 'python'} is missing); build "
                    "it with `make metaworld`, or set PHYSAI_ENV_METAWORLD_PYTHON to its "
                    "interpreter")
    assert not (tmp_path / "home").exists()
