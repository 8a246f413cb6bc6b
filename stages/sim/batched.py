"""The batched environment interface every simulator backend implements."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from stages.sim.scene import RandomizationConfig


@runtime_checkable
class BatchedEnv(Protocol):
    """N independent worlds stepped together, with fixed-length episodes.

    Call :meth:`reset` before the first :meth:`step` and again after the step that returns
    ``done``; stepping past the end of an episode is an error. The caller computes the actions
    of all N worlds in one batched policy call per control step.
    """

    @property
    def num_worlds(self) -> int:
        """Number of worlds N stepped together."""
        ...

    @property
    def obs_dim(self) -> int:
        """Length of one world's observation vector."""
        ...

    @property
    def act_dim(self) -> int:
        """Length of one world's action vector."""
        ...

    @property
    def episode_steps(self) -> int:
        """Control steps in every episode."""
        ...

    def reset(self) -> np.ndarray:
        """Start a new episode in every world, drawing fresh randomization.

        Returns:
            Observations. Shape: (num_worlds, obs_dim), float32.
        """
        ...

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Apply one control step in every world.

        Args:
            actions: Normalized actions, clipped to [-1, 1]. Shape: (num_worlds, act_dim).

        Returns:
            ``(obs, reward, done)``: observations, shape (num_worlds, obs_dim), float32;
            rewards, shape (num_worlds,), float32; and episode-end flags, shape (num_worlds,),
            bool, True for every world at the last step of the episode.
        """
        ...

    def success(self) -> np.ndarray:
        """The task's success predicate at the current state. Shape: (num_worlds,), bool."""
        ...

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action for the current true state (not the noisy observation).

        Returns:
            Actions in [-1, 1]. Shape: (num_worlds, act_dim), float32.
        """
        ...

    def render(self, worlds: Sequence[int], width: int, height: int, camera: str) -> np.ndarray:
        """Render the current state of some worlds offscreen.

        Args:
            worlds: Indices of the worlds to render, each in [0, num_worlds).
            width: Image width (pixels).
            height: Image height (pixels).
            camera: Name of a camera of the task's model (see ``TaskSpec.camera``).

        Returns:
            RGB frames. Shape: (len(worlds), height, width, 3), uint8.
        """
        ...

    def close(self) -> None:
        """Release what the simulator holds (renderer, simulation context)."""
        ...


def randomizes_model(rand: RandomizationConfig) -> bool:
    """Whether a scene's randomization changes the robot model per episode (masses, damping,
    friction, gains, contact friction, payload), so that a backend must redraw it on reset."""
    return any(
        scale != (1.0, 1.0)
        for scale in (rand.mass_scale, rand.damping_scale, rand.friction_scale,
                      rand.gain_scale, rand.contact_friction_scale)
    ) or rand.payload_mass != (0.0, 0.0)


class EpisodeWorlds:
    """What every backend's batched environment keeps the same way: its world count and
    episode length, whether an episode has started, and the checks of what callers pass in
    (actions, world indices). A backend sets ``_num_worlds``, ``_episode_steps`` and
    ``_steps_done`` (-1 until the first reset) and defines ``act_dim``."""

    _num_worlds: int
    _episode_steps: int
    _steps_done: int

    @property
    def act_dim(self) -> int:
        """Length of one world's action vector."""
        raise NotImplementedError

    @property
    def num_worlds(self) -> int:
        """Number of worlds N stepped together."""
        return self._num_worlds

    @property
    def episode_steps(self) -> int:
        """Control steps in every episode."""
        return self._episode_steps

    def _require_episode(self) -> None:
        """Fail unless reset() has started an episode."""
        if self._steps_done < 0:
            raise RuntimeError("no episode has started; call reset() first")

    def _checked_actions(self, actions: np.ndarray, dtype: type = np.float64) -> np.ndarray:
        """``actions`` as an array of ``dtype``, refused unless an episode is running, they
        have shape (num_worlds, act_dim) and every entry is finite."""
        self._require_episode()
        if self._steps_done >= self._episode_steps:
            raise RuntimeError("the episode is over; call reset() first")
        out: np.ndarray = np.asarray(actions, dtype=dtype)
        if out.shape != (self._num_worlds, self.act_dim):
            raise ValueError(f"actions must have shape ({self._num_worlds}, {self.act_dim}), "
                             f"got {out.shape}")
        # One reduction for the common case; the element-wise test only when it is not finite
        # (a sum of huge finite actions can overflow).
        if not math.isfinite(float(out.sum(dtype=np.float64))) and not np.isfinite(out).all():
            raise ValueError("actions contain NaN or infinity")
        return out

    def _world_indices(self, worlds: np.ndarray | Sequence[int]) -> np.ndarray:
        """``worlds`` as a flat int64 array, refused unless an episode is running and each is
        in [0, num_worlds)."""
        self._require_episode()
        idx = np.asarray(worlds, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self._num_worlds):
            raise ValueError(f"worlds must be in [0, {self._num_worlds}), got {idx.tolist()}")
        return idx
