"""reach-v0: determinism, randomization, control semantics, and the scripted expert."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.sim.env.batched import BatchedEnv
from stages.sim.scenes.scene import Scene
from stages.sim.suites.loading import load_scene, load_suite
from stages.sim.tasks import reach
from stages.sim.tasks.catalog import get_task

REACH = Path(__file__).resolve().parents[3] / "sim_scenes" / "reach"
SUITE = load_suite(REACH / "suite.yaml")


def make(scene: Scene, num_worlds: int, seed: int) -> BatchedEnv:
    """Build reach-v0 for ``scene`` through the registry."""
    return get_task("reach-v0").make_env(scene, num_worlds, seed)


def variant(name: str, episode_steps: int | None = None, **randomization: Any) -> Scene:
    """The scene ``name`` of sim_scenes/reach with some fields replaced (and re-validated)."""
    return load_scene(REACH / f"{name}.yaml").replace(episode_steps, **randomization)


def rollout(env: BatchedEnv, actions: np.ndarray) -> list[np.ndarray]:
    """Observations after reset and after each of ``actions`` (shape: steps, N, act_dim)."""
    out = [env.reset()]
    for action in actions:
        out.append(env.step(action)[0])
    return out


def run_expert(env: BatchedEnv) -> float:
    """Run one full episode with the expert; the success rate at the last step."""
    env.reset()
    done = np.zeros(env.num_worlds, dtype=bool)
    while not done.all():
        _, _, done = env.step(env.expert_action())
    return float(env.success().mean())


def test_same_seed_same_observations_different_seed_different() -> None:
    scene = load_scene(REACH / "collect.yaml")
    actions = np.random.default_rng(1).uniform(-1, 1, size=(3, 4, 7))
    first = rollout(make(scene, 4, 7), actions)
    second = rollout(make(scene, 4, 7), actions)
    other = rollout(make(scene, 4, 8), actions)
    for a, b, c in zip(first, second, other, strict=True):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)


def test_each_reset_draws_a_new_episode() -> None:
    env = make(load_scene(REACH / "nominal.yaml"), 4, 0)
    assert not np.array_equal(env.reset(), env.reset())


def test_episode_ends_after_episode_steps() -> None:
    env = make(variant("nominal", episode_steps=3), 2, 0)
    for before_reset in (lambda: env.step(np.zeros((2, 7))), env.success, env.expert_action):
        with pytest.raises(RuntimeError, match="reset"):
            before_reset()
    env.reset()
    dones = [env.step(np.zeros((2, 7)))[2] for _ in range(3)]
    assert [d.tolist() for d in dones] == [[False, False], [False, False], [True, True]]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros((2, 7)))
    env.reset()
    assert not env.step(np.zeros((2, 7)))[2].any()


def test_bad_actions_are_rejected() -> None:
    env = make(load_scene(REACH / "nominal.yaml"), 2, 0)
    env.reset()
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((2, 6)))
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.full((2, 7), np.nan))


def test_actions_are_clipped() -> None:
    scene = load_scene(REACH / "nominal.yaml")
    big = rollout(make(scene, 2, 0), np.full((2, 2, 7), 50.0))
    one = rollout(make(scene, 2, 0), np.ones((2, 2, 7)))
    np.testing.assert_array_equal(big[-1], one[-1])


def test_action_delay_applies_actions_late() -> None:
    actions = np.random.default_rng(2).uniform(-1, 1, size=(3, 2, 7))
    delayed = rollout(make(variant("nominal", action_delay_steps=1), 2, 5), actions)
    shifted = np.concatenate([np.zeros((1, 2, 7)), actions[:-1]])
    direct = rollout(make(load_scene(REACH / "nominal.yaml"), 2, 5), shifted)
    for a, b in zip(delayed, direct, strict=True):
        np.testing.assert_array_equal(a, b)


def test_observation_noise_has_the_configured_spread() -> None:
    clean = make(load_scene(REACH / "nominal.yaml"), 100, 3).reset()
    noisy = make(variant("nominal", obs_noise_std=0.01), 100, 3).reset()
    assert np.std(noisy - clean) == pytest.approx(0.01, rel=0.05)


def test_observation_layout() -> None:
    env = make(load_scene(REACH / "nominal.yaml"), 3, 0)
    obs = env.reset()
    ee, target, delta = obs[:, 14:17], obs[:, 17:20], obs[:, 20:23]
    np.testing.assert_allclose(delta, target - ee, atol=1e-6)
    box = load_scene(REACH / "nominal.yaml").config.randomization
    assert (target >= np.asarray(box.target_low, dtype=np.float32)).all()
    assert (target <= np.asarray(box.target_high, dtype=np.float32)).all()
    obs, reward, _ = env.step(np.zeros((3, 7)))
    np.testing.assert_allclose(reward, -np.linalg.norm(obs[:, 20:23], axis=1), rtol=1e-5)


def test_heavier_links_sag_against_nominal_gravity_compensation() -> None:
    hold = np.zeros((10, 3, 7))
    nominal = rollout(make(load_scene(REACH / "nominal.yaml"), 3, 4), hold)
    heavy = rollout(make(variant("nominal", mass_scale=(1.5, 1.5)), 3, 4), hold)
    assert np.abs(nominal[-1][:, :7] - nominal[0][:, :7]).max() < 1e-3
    assert np.abs(heavy[-1][:, :7] - heavy[0][:, :7]).max() > 0.01


def test_expert_reaches_nominal_targets() -> None:
    env = make(load_scene(REACH / "nominal.yaml"), 100, 0)
    start = time.perf_counter()
    rate = run_expert(env)
    seconds = time.perf_counter() - start
    print(f"reach-v0 nominal: expert success {rate:.2f}, 100 worlds x 100 steps {seconds:.2f} s")
    assert rate >= 0.95


@pytest.mark.parametrize("entry", SUITE.scenes, ids=[s.scene.name for s in SUITE.scenes])
def test_expert_passes_every_suite_scene(entry: Any) -> None:
    rate = run_expert(make(entry.scene, entry.episodes, entry.seed))
    print(f"reach-v0 {entry.scene.name}: expert success {rate:.2f} over {entry.episodes} episodes")
    assert rate >= 0.85


def test_expert_reaches_the_workspace_corners() -> None:
    corners = itertools.product(*zip(reach.WORKSPACE_LOW, reach.WORKSPACE_HIGH, strict=True))
    for corner in corners:
        scene = variant("nominal", target_low=corner, target_high=corner)
        assert run_expert(make(scene, 2, 0)) == 1.0, corner
