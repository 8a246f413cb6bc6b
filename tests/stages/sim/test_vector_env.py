"""The episode logic of vector envs (stages.sim.env.vector_env.VectorEpisodes) on a library of
counters: worlds that end early freeze, or restart with ``restart_fallen``, whether the library
restarts them itself (Isaac Lab) or waits to be reset (Gymnasium); respawns; the success
predicates."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from physai_core.errors import PhysaiError
from stages.sim.env.batched import BatchedEnv
from stages.sim.env.vector_env import VectorEpisodes
from stages.sim.scenes.scene import SuccessConfig


class Counters(VectorEpisodes):
    """World i counts its steps; its env terminates when the count reaches ``limits[i]``.
    The observation is the count, the reward the action. With ``restarts_itself`` the library
    restarts an ended world inside its step (and reports the final count), else it keeps
    counting until reset."""

    def __init__(self, limits: list[int], steps: int, success: SuccessConfig, *,
                 restarts_itself: bool = False) -> None:
        scene: Any = SimpleNamespace(path="counters.yaml",
                                     config=SimpleNamespace(task="counters", episode_steps=steps))
        self._start_worlds(scene, "counters", len(limits))
        self._task = "counters"
        self._start_vector(1, 1, success)
        self._limits = np.array(limits)
        self._count = np.zeros(len(limits))
        self._restarts_itself = restarts_itself
        self.resets: list[list[int]] = []

    def _vector_reset(self) -> np.ndarray:
        self._count[:] = 0
        return self._count[:, None].copy()

    def _vector_step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        self._count += 1
        terminated = self._count >= self._limits
        final = None
        if self._restarts_itself and terminated.any():
            final = self._count[:, None].copy()
            self._count[terminated] = 0
        return self._count[:, None].copy(), actions[:, 0].copy(), terminated, \
            np.zeros_like(terminated), final

    def _reset_worlds(self, mask: np.ndarray) -> np.ndarray:
        self.resets.append(np.flatnonzero(mask).tolist())
        self._count[mask] = 0
        return self._count[:, None].copy()

    def _restart_ended(self, mask: np.ndarray) -> None:
        if self._restarts_itself:
            self._clear(mask)
        else:
            super()._restart_ended(mask)

    def render(self, worlds: Any, width: int, height: int, camera: str) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        pass


SURVIVE = SuccessConfig(survive=True)
ONES = np.ones((2, 1))


@pytest.mark.parametrize("restarts_itself", [False, True])
def test_a_world_that_ends_early_stays_frozen(restarts_itself: bool) -> None:
    env = Counters([2, 99], 5, SURVIVE, restarts_itself=restarts_itself)
    assert isinstance(env, BatchedEnv)
    assert (env.obs_dim, env.act_dim, env.num_worlds) == (1, 1, 2)
    env.reset()
    for step in range(1, 6):
        obs, reward, done = env.step(ONES)
        assert done.all() == (step == 5)
        assert obs[0, 0] == min(step, 2) and obs[1, 0] == step
        assert reward.tolist() == [1.0 if step <= 2 else 0.0, 1.0]
    assert env.fallen().tolist() == [True, False]
    assert env.success().tolist() == [False, True]
    assert not env.restarted.any()
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(ONES)


@pytest.mark.parametrize("restarts_itself", [False, True])
def test_restart_fallen_restarts_and_clears_the_episode(restarts_itself: bool) -> None:
    env = Counters([2, 99], 6, SuccessConfig(min_return=3.0), restarts_itself=restarts_itself)
    env.reset()
    env.step(ONES, restart_fallen=True)
    obs, reward, _ = env.step(ONES, restart_fallen=True)
    assert obs[:, 0].tolist() == [0.0, 2.0] and reward.tolist() == [1.0, 1.0]
    assert env.restarted.tolist() == [True, False]
    assert not env.fallen().any()
    assert env.resets == ([] if restarts_itself else [[0]])
    obs, _, _ = env.step(ONES, restart_fallen=True)
    assert obs[:, 0].tolist() == [1.0, 3.0]
    assert not env.restarted.any()
    assert env.success().tolist() == [False, True]  # world 0's return restarted at 0


def test_an_end_on_the_last_step_neither_freezes_nor_restarts() -> None:
    env = Counters([3, 99], 3, SURVIVE, restarts_itself=True)
    env.reset()
    for _ in range(3):
        obs, _, _ = env.step(ONES, restart_fallen=True)
    assert obs[0, 0] == 3.0  # the final observation, not the library's restart
    assert not env.restarted.any() and env.fallen().tolist() == [True, False]


def test_respawn_restarts_the_given_worlds_and_thaws_them() -> None:
    env = Counters([1, 99], 5, SURVIVE)
    env.reset()
    env.step(ONES)
    obs, _, _ = env.step(ONES)
    assert obs[:, 0].tolist() == [1.0, 2.0]
    after = env.respawn(np.array([0]))
    assert after[:, 0].tolist() == [0.0, 2.0] and not env.fallen().any()
    np.testing.assert_array_equal(env.clean_observation(), after)
    env.clean_observation()[:] = 7.0
    assert env.respawn([])[:, 0].tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="worlds must be in"):
        env.respawn([2])


def test_reset_forgets_the_last_episode() -> None:
    env = Counters([1, 99], 5, SURVIVE)
    with pytest.raises(RuntimeError, match="call reset"):
        env.success()
    env.reset()
    env.step(ONES, restart_fallen=True)
    assert env.restarted.any()
    env.step(ONES)
    env.step(ONES)
    assert env.fallen().tolist() == [True, False]
    env.reset()
    assert not env.restarted.any() and not env.fallen().any()
    obs, reward, _ = env.step(ONES)
    assert reward.tolist() == [1.0, 1.0] and obs[1, 0] == 1.0


def test_a_vector_env_has_no_scripted_expert() -> None:
    with pytest.raises(PhysaiError, match=r"counters has no scripted expert .* collect needs"):
        Counters([99], 5, SURVIVE).expert_action()


def test_actions_are_clipped_and_checked() -> None:
    env = Counters([99, 99], 5, SuccessConfig(min_return=1.0))
    env.reset()
    _, reward, _ = env.step(np.array([[5.0], [-0.5]]))
    assert reward.tolist() == [1.0, -0.5]
    assert env.success().tolist() == [True, False]
    with pytest.raises(ValueError, match="shape"):
        env.step(np.ones((3, 1)))
