"""Demonstrations of reach-v0 for the dataset tests: recorded by Minari's own ``DataCollector``
through a one-world Gymnasium view of the task, and small synthetic episodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stages.datasets.demonstrations import Episode

ROOT = Path(__file__).resolve().parents[3]
COLLECT_SCENE = ROOT / "sim_scenes" / "reach" / "collect.yaml"
TASK = "reach-v0"
OBS_DIM, ACT_DIM = 23, 7


def synthetic_episodes(n: int = 3, steps: int = 5, seed: int = 0) -> tuple[Episode, ...]:
    """``n`` random episodes of ``steps`` steps with reach-v0's widths; even ones succeed."""
    rng = np.random.default_rng(seed)
    return tuple(
        Episode(rng.normal(size=(steps, OBS_DIM)).astype(np.float32),
                rng.uniform(-1, 1, (steps, ACT_DIM)).astype(np.float32),
                rng.normal(size=steps).astype(np.float32), np.arange(steps) == steps - 1,
                i % 2 == 0, i)
        for i in range(n))


def reach_gym(seed: int) -> Any:
    """reach-v0's collect scene, one world, as a Gymnasium environment whose episodes end by
    truncation after the scene's episode length; ``expert()`` is the scripted expert's action."""
    import gymnasium as gym

    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.catalog import get_task

    class ReachGym(gym.Env[np.ndarray, np.ndarray]):
        observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)

        def __init__(self) -> None:
            self.env = get_task(TASK).make_env(load_scene(COLLECT_SCENE), 1, seed)

        def reset(self, *, seed: int | None = None,
                  options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
            super().reset(seed=seed)
            return self.env.reset()[0], {}

        def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool,
                                                    dict[str, Any]]:
            obs, reward, done = self.env.step(np.asarray(action, np.float32)[None])
            return obs[0], float(reward[0]), False, bool(done[0]), {}

        def expert(self) -> np.ndarray:
            return np.asarray(self.env.expert_action()[0], np.float32)

    return ReachGym()


def record_minari(dataset_id: str, episodes: int, noise: float = 0.1, seed: int = 0) -> None:
    """Record ``episodes`` expert episodes of reach-v0 with Minari's ``DataCollector`` as
    ``dataset_id`` under ``$MINARI_DATASETS_PATH`` (executed actions: the expert's plus
    Gaussian noise of std ``noise``, clipped to [-1, 1])."""
    from minari import DataCollector

    env = reach_gym(seed)
    collector = DataCollector(env)
    rng = np.random.default_rng(seed)
    for i in range(episodes):
        collector.reset(seed=seed + i)
        done = False
        while not done:
            action = np.clip(env.expert() + rng.normal(0, noise, ACT_DIM), -1, 1)
            _, _, terminated, truncated, _ = collector.step(action.astype(np.float32))
            done = terminated or truncated
    collector.create_dataset(dataset_id=dataset_id, algorithm_name="scripted expert",
                             author="physai-flows tests", author_email="tests@example.org",
                             code_permalink="https://example.org/physai-flows",
                             description="reach-v0 expert demonstrations")
    collector.close()
