"""Python code as a policy or expert (stages/policies/python_code.py): one controller per world,
made afresh as each episode starts; actions converted from the environment's units; every way a
reference can be wrong refused in one line naming where it was given."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from physai_core.errors import ConfigError
from stages.datasets.recording import python_expert, record_episodes
from stages.evaluation.rollout import rollout
from stages.policies.python_code import PythonPolicy, python_policy
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "python_code"
TASK = "gymnasium:InvertedPendulum-v5"


@pytest.fixture(autouse=True)
def _controllers_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def _policy(ref: str) -> PythonPolicy:
    return python_policy(ref, get_task(TASK).action_range(), "cfg.yaml", "collect.expert")


def test_a_stateful_controller_is_made_afresh_per_world_and_episode() -> None:
    scene = load_scene(FIXTURES / "pendulum_short.yaml")  # 200 steps; the controller allows 1000
    env = get_task(TASK).make_env(scene, 3, seed=5)
    act = _policy("python:controllers:PendulumPD")
    for _ in range(6):  # 1,200 steps in all: one controller for every episode would refuse
        outcome = rollout(env, act)
        assert outcome.success.all()
    assert act._controllers is not None and len({id(c) for c in act._controllers}) == 3
    assert [c.steps for c in act._controllers] == [200] * 3
    # the recording door: the same controller as collect's expert, from the clean observation
    expert = python_expert("python:controllers:PendulumPD", get_task(TASK).action_range(),
                           "cfg.yaml", "collect.expert")
    for round_seed in range(6):
        episodes = record_episodes(get_task(TASK).make_env(scene, 2, round_seed), expert,
                                   lambda obs, images, label: label, round_seed)
        assert all(e.success for e in episodes)


def test_actions_in_the_environment_units_become_the_pipelines() -> None:
    act = _policy("python:controllers:pushes_right")  # 3 N, the top of the -3..3 N Box
    assert act(np.zeros((2, 4), np.float32)).tolist() == [[1.0], [1.0]]
    pd = _policy("python:controllers:pendulum_pd")
    obs = np.array([[0.0, 0.1, 0.0, 0.0]], np.float32)
    assert pd(obs)[0, 0] == pytest.approx(10 * 0.1 / 3, rel=1e-5)


def test_a_factory_taking_make_kwargs_is_given_the_scenes(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    def factory(make_kwargs: dict[str, Any]) -> Any:
        seen.append(make_kwargs)
        return lambda obs: [0.0]

    module = type(sys)("made_here")
    module.factory = factory  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "made_here", module)
    scene_file = tmp_path / "scene.yaml"
    scene_file.write_text(f"name: heavy_pole\ntask: {TASK}\nepisode_steps: 5\n"
                          "success: {survive: true}\nmake_kwargs: {reset_noise_scale: 0.02}\n")
    env = get_task(TASK).make_env(load_scene(scene_file), 2, seed=0)
    rollout(env, _policy("python:made_here:factory"))
    assert seen == [{"reset_noise_scale": 0.02}] * 2


@pytest.mark.parametrize(("ref", "message"), [
    ("python:controllers", "is not python:PACKAGE.MODULE:CALLABLE"),
    ("python:no_such_module_here:f", "module 'no_such_module_here' does not import here "
     "(ModuleNotFoundError"),
    ("python:controllers:missing", "module 'controllers' has no attribute 'missing'"),
    ("python:controllers:GAINS", "GAINS is a ndarray, not a class, factory or controller"),
])
def test_a_bad_reference_is_one_line_naming_where(ref: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _policy(ref)
    text = str(caught.value)
    assert text.startswith("cfg.yaml: collect.expert: ") and message in text
    assert "\n" not in text


def test_a_controller_that_answers_wrongly_is_named() -> None:
    act = _policy("python:controllers:pendulum_pd")
    with pytest.raises(Exception, match="python:controllers:pendulum_pd returned action"):
        act(np.full((1, 4), np.nan, np.float32))


def test_a_gymnasium_task_is_probed_with_its_first_scenes_make_kwargs(tmp_path: Path) -> None:
    from stages.sim.backends.gymnasium_tasks import GymEnvError, make_task

    task = "gymnasium:kwarg_env:KwargEnv-v0"
    with pytest.raises(GymEnvError, match="a scene of the task gives what it needs in "
                       "make_kwargs"):
        make_task("kwarg_env:KwargEnv-v0")
    scene_file = tmp_path / "scene.yaml"
    scene_file.write_text(f"name: three\ntask: {task}\nepisode_steps: 40\n"
                          "make_kwargs: {size: 3}\nsuccess: {info: near}\n")
    scene = load_scene(scene_file)
    spec = get_task(task)
    assert (spec.obs_dim, spec.act_dim, spec.control_hz) == (3, 3, 10.0)
    # a controller that drives the point home, its actions in the environment's units
    module = type(sys)("homing")
    module.home = lambda obs: -5.0 * np.asarray(obs)  # type: ignore[attr-defined]
    sys.modules["homing"] = module
    try:
        outcome = rollout(spec.make_env(scene, 4, seed=1),
                          python_policy("python:homing:home", spec.action_range(), "x", "y"))
    finally:
        del sys.modules["homing"]
    assert outcome.success.all()
    other = tmp_path / "five.yaml"
    other.write_text(f"name: five\ntask: {task}\nepisode_steps: 40\n"
                     "make_kwargs: {size: 5}\nsuccess: {info: near}\n")
    with pytest.raises(ConfigError, match="they change the spaces"):
        load_scene(other)


def test_seed_at_make_is_refused_where_it_cannot_apply(tmp_path: Path) -> None:
    task = "gymnasium:kwarg_env:KwargEnv-v0"
    both = tmp_path / "both.yaml"
    both.write_text(f"name: both\ntask: {task}\nepisode_steps: 5\nseed_at_make: true\n"
                    "make_kwargs: {size: 3, seed: 4}\nsuccess: {info: near}\n")
    with pytest.raises(ConfigError, match=r"make_kwargs\.seed: .*seed_at_make gives each world"):
        load_scene(both)
    mujoco = tmp_path / "mujoco.yaml"
    mujoco.write_text("name: m\ntask: reach-v0\nepisode_steps: 5\nseed_at_make: true\n"
                      "randomization: {target_low: [0.4, -0.1, 0.3], "
                      "target_high: [0.5, 0.1, 0.4]}\n")
    with pytest.raises(ConfigError, match="only Gymnasium tasks take seed_at_make"):
        load_scene(mujoco)


def test_each_world_is_made_with_its_own_seed_when_the_scene_says_so(tmp_path: Path) -> None:
    task = "gymnasium:kwarg_env:KwargEnv-v0"
    made = {}
    for flag in ("false", "true"):
        scene_file = tmp_path / f"{flag}.yaml"
        scene_file.write_text(f"name: s{flag}\ntask: {task}\nepisode_steps: 2\n"
                              f"seed_at_make: {flag}\nmake_kwargs: {{size: 3}}\n"
                              "success: {info: near}\n")
        env = get_task(task).make_env(load_scene(scene_file), 3, seed=11)
        made[flag] = [e.unwrapped.made_seed for e in env._vec.envs]  # type: ignore[attr-defined]
        env.close()
    assert made["false"] == [None] * 3
    assert made["true"] == np.random.SeedSequence(11).generate_state(3).tolist()
