"""locomotion-v0: observation layout, randomization, pushes, falls, and the scripted gait."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.sim.scenes.scene import Scene
from stages.sim.suites.loading import load_scene, load_suite
from stages.sim.tasks import locomotion
from stages.sim.tasks.locomotion import LocomotionEnv

LOCOMOTION = Path(__file__).resolve().parents[3] / "sim_scenes" / "locomotion"
SUITE = load_suite(LOCOMOTION / "suite.yaml")


def variant(name: str, episode_steps: int | None = None, **randomization: Any) -> Scene:
    """The scene ``name`` of sim_scenes/locomotion with some fields replaced (and re-validated)."""
    return load_scene(LOCOMOTION / f"{name}.yaml").replace(episode_steps, **randomization)


def run_expert(env: LocomotionEnv) -> float:
    """Run one full episode with the expert; the success rate at the end."""
    env.reset()
    done = np.zeros(env.num_worlds, dtype=bool)
    while not done.all():
        _, _, done = env.step(env.expert_action())
    return float(env.success().mean())


def rollout(env: LocomotionEnv, actions: np.ndarray) -> list[np.ndarray]:
    """Observations after reset and after each of ``actions`` (shape: steps, N, 12)."""
    out = [env.reset()]
    for action in actions:
        out.append(env.step(action)[0])
    return out


def test_observation_layout_at_reset() -> None:
    env = LocomotionEnv(load_scene(LOCOMOTION / "flat.yaml"), 8, 0)
    obs = env.reset()
    names = locomotion.OBS_NAMES
    gravity = obs[:, names.index("projected_gravity.x") : names.index("projected_gravity.z") + 1]
    np.testing.assert_allclose(gravity, [[0.0, 0.0, -1.0]] * 8, atol=1e-6)
    command = obs[:, names.index("command.vx") : names.index("command.yaw_rate") + 1]
    np.testing.assert_allclose(command, env.command, rtol=1e-6)
    assert (env.command[:, 0] >= 0.2).all() and (env.command[:, 0] <= 0.6).all()
    np.testing.assert_array_equal(env.command[:, 1:], 0.0)
    joints = obs[:, names.index("FL_abduction.pos") : names.index("RR_knee.pos") + 1]
    stand = np.tile([0.0, 0.7, -1.4], 4)
    assert np.abs(joints - stand).max() <= locomotion.INIT_JOINT_NOISE + 1e-6
    last = obs[:, names.index("FL_abduction.last_action") : names.index("RR_knee.last_action") + 1]
    assert not last.any()
    clock = obs[:, names.index("gait_clock.sin") :]
    np.testing.assert_allclose(clock, [[0.0, 1.0]] * 8, atol=1e-6)


def test_gait_clock_runs_per_world_and_restarts_on_respawn() -> None:
    env = LocomotionEnv(load_scene(LOCOMOTION / "flat.yaml"), 4, 0)
    env.reset()
    names = locomotion.OBS_NAMES
    sin, cos = names.index("gait_clock.sin"), names.index("gait_clock.cos")
    hold = np.zeros((4, env.act_dim))
    for _ in range(5):
        obs, _, _ = env.step(hold)
    phase = 2 * np.pi * 5 / locomotion.CONTROL_HZ / locomotion.GAIT.period
    np.testing.assert_allclose(obs[:, sin], np.sin(phase), atol=1e-5)
    np.testing.assert_allclose(obs[:, cos], np.cos(phase), atol=1e-5)
    obs = env.respawn(np.array([2]))
    np.testing.assert_allclose(obs[2, [sin, cos]], [0.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(obs[[0, 1, 3], sin], np.sin(phase), atol=1e-5)


def test_last_action_is_the_chosen_action_clipped() -> None:
    env = LocomotionEnv(variant("flat", action_delay_steps=2), 3, 0)
    env.reset()
    action = np.random.default_rng(0).uniform(-2.0, 2.0, size=(3, 12))
    obs, _, _ = env.step(action)
    start = locomotion.OBS_NAMES.index("FL_abduction.last_action")
    np.testing.assert_allclose(obs[:, start : start + 12], np.clip(action, -1.0, 1.0), rtol=1e-6)


def test_action_delay_applies_actions_late() -> None:
    actions = np.random.default_rng(2).uniform(-0.3, 0.3, size=(3, 2, 12))
    delayed = LocomotionEnv(variant("flat", action_delay_steps=1), 2, 5)
    direct = LocomotionEnv(load_scene(LOCOMOTION / "flat.yaml"), 2, 5)
    shifted = np.concatenate([np.zeros((1, 2, 12)), actions[:-1]])
    physics = slice(0, locomotion.OBS_NAMES.index("FL_abduction.last_action"))
    for a, b in zip(rollout(delayed, actions), rollout(direct, shifted), strict=True):
        np.testing.assert_array_equal(a[:, physics], b[:, physics])


def test_observation_noise_has_the_configured_spread() -> None:
    clean = LocomotionEnv(load_scene(LOCOMOTION / "flat.yaml"), 100, 3).reset()
    noisy = LocomotionEnv(variant("flat", obs_noise_std=0.02), 100, 3).reset()
    assert np.std(noisy - clean) == pytest.approx(0.02, rel=0.05)


def test_model_randomization_reaches_every_world() -> None:
    scene = variant(
        "flat",
        payload_mass=(2.0, 2.0),
        mass_scale=(1.2, 1.2),
        damping_scale=(1.5, 1.5),
        friction_scale=(0.5, 0.5),
        gain_scale=(0.8, 0.8),
        contact_friction_scale=(0.4, 0.4),
    )
    env = LocomotionEnv(scene, 3, 0)
    env.reset()
    batch = env.batch
    np.testing.assert_allclose(batch.body("torso").mass, [[6.2 * 1.2 + 2.0]] * 3)
    np.testing.assert_allclose(batch.body("FL_thigh").mass, [[0.5 * 1.2]] * 3)
    np.testing.assert_allclose(batch.joint("FL_knee").damping, [[0.2 * 1.5]] * 3)
    np.testing.assert_allclose(batch.joint("FL_knee").frictionloss, [[0.05 * 0.5]] * 3)
    np.testing.assert_allclose(batch.actuator("FL_knee").gainprm[:, 0], [150 * 0.8] * 3)
    np.testing.assert_allclose(batch.actuator("FL_knee").biasprm[:, 1], [-150 * 0.8] * 3)
    np.testing.assert_allclose(batch.geom("floor").friction[:, 0], [0.4] * 3)
    np.testing.assert_allclose(batch.geom("FL_foot").friction[:, 0], [0.4] * 3)


def test_a_push_changes_the_torso_velocity_at_its_step() -> None:
    scene = variant("flat", push_velocity=(0.8, 0.8), push_interval_steps=(3, 3))
    env = LocomotionEnv(scene, 4, 0)
    calm = LocomotionEnv(load_scene(LOCOMOTION / "flat.yaml"), 4, 0)
    env.reset()
    calm.reset()
    hold = np.zeros((4, 12))
    for step in range(4):
        before = np.array(env.batch.qvel[:, :2]) - np.array(calm.batch.qvel[:, :2])
        env.step(hold)
        calm.step(hold)
        after = np.array(env.batch.qvel[:, :2]) - np.array(calm.batch.qvel[:, :2])
        change = np.linalg.norm(after - before, axis=1)
        if step == 3:
            assert (change > 0.4).all()
        else:
            assert (change < 1e-9).all(), step


def test_collapse_is_a_fall_with_one_penalty() -> None:
    env = LocomotionEnv(variant("flat", episode_steps=60, gain_scale=(0.02, 0.02)), 4, 0)
    env.reset()
    rewards = [env.step(np.zeros((4, 12)))[1] for _ in range(60)]
    assert env.fallen().all()
    assert not env.success().any()
    penalties = (np.array(rewards) < -locomotion.FALL_PENALTY / 2).sum(axis=0)
    np.testing.assert_array_equal(penalties, 1)


def test_success_needs_the_second_half_of_the_episode() -> None:
    env = LocomotionEnv(variant("flat", episode_steps=10), 2, 0)
    env.reset()
    for _ in range(5):
        env.step(env.expert_action())
    assert not env.success().any()
    assert np.isnan(env.forward_speed_error()).all()
    env.step(env.expert_action())
    assert np.isfinite(env.forward_speed_error()).all()


def test_standing_still_does_not_track_a_forward_command() -> None:
    env = LocomotionEnv(load_scene(LOCOMOTION / "flat.yaml"), 16, 0)
    env.reset()
    for _ in range(env.episode_steps):
        env.step(np.zeros((16, 12)))
    assert not env.fallen().any()
    np.testing.assert_allclose(env.forward_speed_error(), env.command[:, 0], atol=0.05)
    assert not env.success().any()


def test_expert_trots_on_flat_ground() -> None:
    env = LocomotionEnv(load_scene(LOCOMOTION / "flat.yaml"), 64, 0)
    start = time.perf_counter()
    rate = run_expert(env)
    seconds = time.perf_counter() - start
    print(f"locomotion-v0 flat: expert success {rate:.2f}, 64 worlds x 250 steps {seconds:.2f} s")
    assert rate >= 0.9
    assert not env.fallen().any()


def test_expert_follows_lateral_and_turning_commands() -> None:
    scene = variant(
        "flat", target_low=(-0.2, -0.2, -0.5), target_high=(0.6, 0.2, 0.5)
    )
    env = LocomotionEnv(scene, 32, 1)
    obs = env.reset()
    names = locomotion.OBS_NAMES
    vy, yaw = names.index("base_lin_vel.y"), names.index("base_ang_vel.z")
    late = []
    for step in range(env.episode_steps):
        obs, _, _ = env.step(env.expert_action())
        if 2 * step >= env.episode_steps:
            late.append(obs[:, [vy, yaw]])
    mean = np.mean(late, axis=0)
    assert np.abs(mean[:, 0] - env.command[:, 1]).mean() < 0.06
    assert np.abs(mean[:, 1] - env.command[:, 2]).mean() < 0.1
    assert env.success().mean() >= 0.9


EXPERT_MIN_SUCCESS = {"flat": 0.95, "heavy_payload": 0.95, "low_friction": 0.95, "pushes": 0.7}
"""Least expert success per suite scene; shoves of up to 0.6 m/s cost some episodes their
speed tolerance."""


@pytest.mark.parametrize("entry", SUITE.scenes, ids=[s.scene.name for s in SUITE.scenes])
def test_expert_passes_every_suite_scene(entry: Any) -> None:
    rate = run_expert(LocomotionEnv(entry.scene, entry.episodes, entry.seed))
    print(f"locomotion-v0 {entry.scene.name}: expert success {rate:.2f} over {entry.episodes}")
    assert rate >= EXPERT_MIN_SUCCESS[entry.scene.name]
