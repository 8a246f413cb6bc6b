"""What a batched environment can do beyond :class:`~stages.sim.env.batched.BatchedEnv`.

Every backend's environment declares its optional capabilities in one frozen record,
:class:`EnvCapabilities`, read through its ``capabilities`` property; a caller asks
:func:`capabilities_of` before it uses one, never the attribute itself. Each capability names
the methods it promises (the protocols below give their types). An environment that declares
nothing (a plugin's written before the record existed) can do only what ``BatchedEnv``
promises, so every capability defaults to False.

This module imports nothing of the simulator, so every layer that holds an environment may
import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class EnvCapabilities:
    """The optional capabilities of one batched environment; False: it cannot."""

    cameras: bool = False
    """It renders its task's declared cameras: ``cameras`` and ``camera_images()``
    (:class:`~stages.sim.env.cameras.SeesCameras`)."""
    tiled_cameras: bool = False
    """Its cameras can draw many worlds into the tiles of one framebuffer, as
    :meth:`TilesCameras.tile_cameras` says (:mod:`stages.sim.env.tiled`)."""
    falls: bool = False
    """A world can fail for good mid-episode (a fallen robot, an environment that terminated):
    ``fallen()`` (:class:`Falls`)."""
    restarts: bool = False
    """Single worlds can restart mid-episode: ``respawn(worlds)``, ``step(actions,
    restart_fallen=True)`` and ``restarted`` (:class:`Restarts`)."""
    success_miss: bool = False
    """It states the miss below which an episode succeeds: ``success_miss()``
    (:class:`StatesMiss`), in the unit of its episode miss."""
    model_draws: bool = False
    """It draws the scene's model randomization (masses, payload, damping, friction, gains,
    contact friction) per world and episode, and records the draws among its conditions."""
    body_layout: bool = False
    """Its worlds' body poses can be read: ``body_layout()`` and ``body_poses(worlds)``
    (:class:`~stages.sim.env.bodies.RecordsBodies`)."""
    clean_observation: bool = False
    """It shows the observation without sensor noise, what a privileged teacher sees:
    ``clean_observation()`` (:class:`ShowsCleanObservation`)."""
    failure_modes: bool = False
    """It says why each failed episode failed, in its task's words (missed grasp, dropped,
    ...): ``episode_failures()`` (:class:`ExplainsFailures`)."""
    make_kwargs: bool = False
    """It was made by a library with the scene's make kwargs (which of a benchmark's tasks it
    is): ``make_kwargs`` (:class:`MadeWithKwargs`)."""
    steps_off_thread: bool = False
    """``step`` may run on a thread other than the one that built it, its physics releasing
    the GIL (a group of an overlapped rollout, :mod:`stages.sim.env.overlap`);
    ``release_thread()`` frees what that thread held (:class:`StepsOffThread`)."""


NOTHING = EnvCapabilities()
"""The capabilities of an environment that declares none."""


@runtime_checkable
class DeclaresCapabilities(Protocol):
    """An environment that declares its optional capabilities."""

    @property
    def capabilities(self) -> EnvCapabilities:
        """What it can do beyond ``BatchedEnv``."""
        ...


def capabilities_of(env: object) -> EnvCapabilities:
    """What ``env`` declares it can do; :data:`NOTHING` for an environment that declares
    nothing."""
    return env.capabilities if isinstance(env, DeclaresCapabilities) else NOTHING


class Falls(Protocol):
    """An environment that declares ``falls``."""

    def fallen(self) -> np.ndarray:
        """Whether each world failed for good since its episode (re)started.
        Shape: (num_worlds,), bool."""
        ...


class Restarts(Protocol):
    """An environment that declares ``restarts``."""

    def step(self, actions: np.ndarray, *, restart_fallen: bool = False
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One control step; with ``restart_fallen`` the worlds that fell restart before
        observing. Shapes as :meth:`~stages.sim.env.batched.BatchedEnv.step`."""
        ...

    @property
    def restarted(self) -> np.ndarray:
        """Worlds restarted in the last step. Shape: (num_worlds,), bool."""
        ...

    def respawn(self, worlds: np.ndarray | Sequence[int]) -> np.ndarray:
        """Restart ``worlds``; the observation of every world after. Shape: (N, obs_dim)."""
        ...


class StatesMiss(Protocol):
    """An environment that declares ``success_miss``."""

    def success_miss(self) -> float:
        """The miss below which an episode succeeds, in the unit of the episode miss."""
        ...


class ExplainsFailures(Protocol):
    """An environment that declares ``failure_modes``."""

    def episode_failures(self) -> np.ndarray:
        """Each world's failure mode at the current state of its episode, ``""`` for a world
        that meets the success predicate. Shape: (num_worlds,), str."""
        ...


class MadeWithKwargs(Protocol):
    """An environment that declares ``make_kwargs``."""

    @property
    def make_kwargs(self) -> dict[str, object]:
        """The scene's make kwargs its worlds were made with."""
        ...


class ShowsCleanObservation(Protocol):
    """An environment that declares ``clean_observation``."""

    def clean_observation(self) -> np.ndarray:
        """The observation without sensor noise. Shape: (num_worlds, obs_dim), float32."""
        ...


class TilesCameras(Protocol):
    """An environment that declares ``tiled_cameras``."""

    def tile_cameras(self, setting: str) -> None:
        """Render the cameras as ``setting`` says: ``off``, ``on``, ``auto`` or a number of
        worker processes (:func:`stages.sim.env.tiled.tile_processes`)."""
        ...


class StepsOffThread(Protocol):
    """An environment that declares ``steps_off_thread``."""

    def release_thread(self) -> None:
        """Free what the calling thread held of the environment (its renderer)."""
        ...
