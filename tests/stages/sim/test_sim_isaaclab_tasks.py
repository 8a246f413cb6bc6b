"""Isaac Lab's own registered cartpole (``isaaclab:Isaac-Cartpole-Direct-v0``) as a batched
environment, kit-less on Newton on the CPU: its description, the describe CLI, the episode
semantics of the Gymnasium adapter (frozen worlds, restarts, respawns), an oracle that a zero
policy fails and a balancing controller passes, and a second env built after closing the first.

Isaac Lab 3's cartpole terminates only when the cart leaves its rail (|x| > 3 m), not when the
pole falls, so the balancing scenes judge success by the episode's return (upright: about 1 per
second of episode; hanging: below zero).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("isaaclab")

from physai_core.errors import PhysaiError
from stages.sim.backends.isaaclab_tasks import IsaacLabTaskEnv, describe
from stages.sim.scenes.scene import Scene
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task

GYM_ID = "Isaac-Cartpole-Direct-v0"
TASK = f"isaaclab:{GYM_ID}"
STEPS = 200
WORLDS = 8
GAINS = np.array([1.0, -5.5, 1.2, -1.2], np.float32)
"""Balancing state feedback on (cart x, pole angle, cart velocity, pole angular velocity): an
LQR design for the linearized cartpole (1 kg cart with 10 N s/m rail damping, 1 kg pole with
its centre 0.47 m up, force = 100 N * action), which keeps all 64 worlds of a seed up."""
ROOT = Path(__file__).resolve().parents[3]


def _scene(tmp_path: Path, name: str, success: str) -> Scene:
    """A cartpole scene of STEPS steps with the given success predicate, loaded from YAML."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\ntask: {TASK}\nepisode_steps: {STEPS}\nsuccess: {success}\n")
    return load_scene(path)


def _balance(obs: np.ndarray) -> np.ndarray:
    """The balancing controller's normalized action. Shape: (N, 1)."""
    return np.clip(obs @ GAINS, -1.0, 1.0)[:, None]


def _push(env: IsaacLabTaskEnv) -> np.ndarray:
    """Full force along +x on every cart: it leaves its rail within a second."""
    return np.ones((env.num_worlds, env.act_dim), np.float32)


@pytest.fixture(scope="module")
def facts() -> dict[str, object]:
    """describe() of the cartpole."""
    return describe(GYM_ID)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsaacLabTaskEnv]:
    """WORLDS worlds of a scene that succeeds with a return of at least 2.5 (upright all along:
    about 3.3), built through the task registry."""
    scene = _scene(tmp_path_factory.mktemp("scenes"), "balance", "{min_return: 2.5}")
    built = get_task(TASK).make_env(scene, WORLDS, 0)
    assert isinstance(built, IsaacLabTaskEnv)
    yield built
    built.close()


def test_describe_gives_cartpoles_sizes_and_rate(facts: dict[str, object],
                                                  env: IsaacLabTaskEnv) -> None:
    assert facts["gym_id"] == "Isaac-Cartpole-Direct"
    assert (facts["obs_dim"], facts["act_dim"]) == (4, 1) == (env.obs_dim, env.act_dim)
    assert facts["obs_names"] == [f"obs[{i}]" for i in range(4)]
    assert facts["action_names"] == ["act[0]"]
    assert facts["control_hz"] == pytest.approx(60.0)
    assert facts["action_scale"] == 100.0 and facts["local_assets"] is True
    assert isinstance(facts["isaaclab_version"], str)
    json.dumps(facts)
    spec = get_task(TASK)
    assert (spec.obs_dim, spec.act_dim, spec.control_hz) == (4, 1, pytest.approx(60.0))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stages.sim.backends.isaaclab_tasks", *args],
                          cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)


def test_cli_prints_one_json_line(facts: dict[str, object]) -> None:
    done = _cli("describe", GYM_ID)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == facts


def test_cli_unknown_id_exits_2_with_one_line() -> None:
    done = _cli("describe", "Isaac-Cartpol-Direct-v0")
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "Isaac-Cartpol-Direct-v0" in errors[0] and "Isaac-Cartpole-Direct" in errors[0]


def test_zero_actions_let_the_poles_fall(env: IsaacLabTaskEnv) -> None:
    obs = env.reset()
    assert obs.shape == (WORLDS, 4) and obs.dtype == np.float32
    zero = np.zeros((WORLDS, 1), np.float32)
    for step in range(STEPS):
        obs, reward, done = env.step(zero)
        assert done.all() == (step == STEPS - 1)
    assert reward.dtype == np.float32 and np.isfinite(obs).all()
    assert (np.abs(obs[:, 1]) > np.pi / 2).mean() >= 0.75
    assert not env.success().any()
    assert not env.fallen().any()  # the pole's fall ends no Isaac Lab episode: only the rail does
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(zero)


def test_balancing_controller_keeps_every_pole_up(env: IsaacLabTaskEnv) -> None:
    obs = env.reset()
    worst = 0.0
    for step in range(STEPS):
        obs, _, _ = env.step(_balance(obs))
        if step >= STEPS // 2:
            worst = max(worst, float(np.abs(obs[:, 1]).max()))
    assert worst < 0.2
    assert env.success().all()
    assert not env.fallen().any()


def test_a_world_that_terminates_stays_frozen(env: IsaacLabTaskEnv) -> None:
    env.reset()
    for _ in range(STEPS // 2):
        obs, reward, _ = env.step(_push(env))
        if env.fallen().any():
            break
    ended = env.fallen()
    assert ended.any()
    assert (np.abs(obs[ended, 0]) > 3.0).all()  # the final observation, not Isaac Lab's restart
    frozen = obs[ended]
    for _ in range(5):
        obs, reward, _ = env.step(_push(env))
        np.testing.assert_array_equal(obs[ended], frozen)
        assert (reward[ended] == 0.0).all()
    assert not env.restarted.any()


def test_restart_fallen_reports_restarted_worlds(env: IsaacLabTaskEnv) -> None:
    env.reset()
    for _ in range(STEPS // 2):
        obs, _, _ = env.step(_push(env), restart_fallen=True)
        restarted = env.restarted
        if restarted.any():
            break
    assert restarted.any()
    assert (np.abs(obs[restarted, 0]) <= 1.0).all()  # Isaac Lab's fresh initial state
    assert not env.fallen()[restarted].any()
    env.step(np.zeros((WORLDS, 1), np.float32), restart_fallen=True)
    assert not env.restarted[restarted].any()


def test_respawn_restarts_the_given_worlds(env: IsaacLabTaskEnv) -> None:
    obs = env.reset()
    for _ in range(30):
        obs, _, _ = env.step(_push(env))
    assert (np.abs(obs[:, 0]) > 1.0).any()
    after = env.respawn(np.array([1, 3]))
    others = np.setdiff1d(np.arange(WORLDS), [1, 3])
    np.testing.assert_array_equal(after[others], obs[others])
    assert (np.abs(after[[1, 3], 0]) <= 1.0).all()
    np.testing.assert_array_equal(env.clean_observation(), after)
    with pytest.raises(ValueError, match="worlds must be in"):
        env.respawn(np.array([WORLDS]))


def test_no_expert_no_renderer(env: IsaacLabTaskEnv) -> None:
    with pytest.raises(PhysaiError, match="no scripted expert"):
        env.expert_action()
    with pytest.raises(RuntimeError, match="no renderer"):
        env.render([0], 32, 32, "-")


def test_info_predicate_is_refused_before_building(tmp_path: Path) -> None:
    scene = _scene(tmp_path, "info", "{info: success}")
    with pytest.raises(PhysaiError, match="not supported"):
        IsaacLabTaskEnv(scene, 2, 0)


def test_close_then_a_second_env_survive_predicate(env: IsaacLabTaskEnv, tmp_path: Path) -> None:
    env.close()
    second = IsaacLabTaskEnv(_scene(tmp_path, "survive", "{survive: true}"), 4, 1, device="cpu")
    try:
        obs = second.reset()
        for _ in range(STEPS // 2):
            obs, _, _ = second.step(_balance(obs))
        assert second.success().all()
        for _ in range(STEPS // 2):
            second.step(_push(second))
        assert second.fallen().all() and not second.success().any()
    finally:
        second.close()
