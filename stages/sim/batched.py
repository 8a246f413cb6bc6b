"""The batched environment interface every simulator backend implements."""

from __future__ import annotations

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
