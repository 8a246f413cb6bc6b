"""The batched environment interface every simulator backend implements."""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from stages.core.settings import sim_threads
from stages.sim.env.capabilities import EnvCapabilities

if TYPE_CHECKING:
    from stages.sim.scenes.scene import RandomizationConfig, Scene


THREADS_ENV = "PHYSAI_SIM_THREADS"
"""Environment variable that sets the number of stepping threads (default: every CPU)."""


def default_num_threads() -> int:
    """Stepping threads: ``$PHYSAI_SIM_THREADS`` when set, else ``os.cpu_count()``."""
    return sim_threads() or os.cpu_count() or 1


@runtime_checkable
class BatchedEnv(Protocol):
    """N independent worlds stepped together, with fixed-length episodes.

    Call :meth:`reset` before the first :meth:`step` and again after the step that returns
    ``done``; stepping past the end of an episode is an error. The caller computes the actions
    of all N worlds in one batched policy call per control step. What more it can do it
    declares in :attr:`capabilities` (:func:`~stages.sim.env.capabilities.capabilities_of`).
    """

    @property
    def capabilities(self) -> EnvCapabilities:
        """Its optional capabilities (cameras, tiled rendering, falls, restarts, ...)."""
        ...

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


@dataclass(frozen=True)
class ModelDraws:
    """One episode's model randomization, per world: factors and the payload (kg)."""

    mass: np.ndarray
    """Mass factor of each moving body. Shape: (N, links)."""
    payload: np.ndarray
    """Payload (kg) added to the payload body. Shape: (N,)."""
    damping: np.ndarray
    """Joint-damping factor per degree of freedom. Shape: (N, dofs)."""
    friction: np.ndarray
    """Joint dry-friction factor per degree of freedom. Shape: (N, dofs)."""
    gain: np.ndarray
    """Servo-gain factor per actuator. Shape: (N, actuators)."""
    contact: np.ndarray
    """Contact sliding-friction factor. Shape: (N,)."""


@dataclass(frozen=True)
class LookDraws:
    """One episode's visual variation, per world; a field the scene leaves unset is None (or,
    for colours, absent) and drew nothing."""

    light_scale: np.ndarray | None
    """Factor on every light's colours and the headlight's. Shape: (N,)."""
    light_tilt: np.ndarray | None
    """Each light's tilt (rad) and the direction it tilts towards (rad, about the light's
    nominal direction). Shape: (N, lights, 2)."""
    colours: dict[str, np.ndarray]
    """Named geom -> its RGB colour, 0..1. Shape: (N, 3) each."""
    camera_offset: np.ndarray | None
    """Offset (m, world axes) of each of the task's cameras. Shape: (N, cameras, 3)."""
    camera_rotation: np.ndarray | None
    """Rotation of each of the task's cameras as a rotation vector (rad, camera frame): its
    direction the axis, its length the angle. Shape: (N, cameras, 3)."""


LOOK_UNITS = {"light_intensity_scale": "factor", "light_tilt": "deg", "camera_offset": "m",
              "camera_rotation": "deg", "image_noise_std": "intensity levels (0..255)"}
"""Unit of every recorded visual condition but the geom colours (``colour_<geom>_red``,
``_green``, ``_blue``: 0..1)."""

CHANNELS = ("red", "green", "blue")
"""Suffixes of a geom's recorded colour channels."""


def _random_axes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Directions uniform on the unit sphere. Shape: (*shape, 3)."""
    axes = rng.normal(size=(*shape, 3))
    norm = np.linalg.norm(axes, axis=-1, keepdims=True)
    return np.divide(axes, norm, out=np.tile([0.0, 0.0, 1.0], (*shape, 1)), where=norm > 0)


def scaled_masses(nominal: np.ndarray, links: np.ndarray, draws: ModelDraws,
                  payload_body: int) -> tuple[np.ndarray, np.ndarray]:
    """Every world's body masses (kg) after ``draws``: the ``links`` bodies' nominal masses
    (shape (B,)) scaled, the payload added to ``payload_body``; and each body's factor over
    its nominal mass (1 for a massless body). Shapes: (N, B) and (N, B)."""
    scale = np.ones((draws.payload.size, nominal.size))
    scale[:, links] = draws.mass
    body_mass = nominal * scale
    body_mass[:, payload_body] += draws.payload
    factor = np.divide(body_mass, nominal, out=np.ones_like(body_mass), where=nominal > 0)
    return body_mass, factor


class EpisodeWorlds:
    """What every backend's batched environment keeps the same way: its world count and
    episode length, whether an episode has started, and the checks of what callers pass in
    (actions, world indices). A backend sets ``_num_worlds``, ``_episode_steps`` and
    ``_steps_done`` (-1 until the first reset) and defines ``act_dim``."""

    _num_worlds: int
    _episode_steps: int
    _steps_done: int
    _restarted: np.ndarray

    def _start_worlds(self, scene: Scene, task_name: str, num_worlds: int) -> None:
        """Check that ``scene`` is of ``task_name`` and ``num_worlds`` >= 1, and set the world
        count, the episode length and the episode clock (no episode started)."""
        if scene.config.task != task_name:
            raise ValueError(
                f"{task_name} cannot run scene {scene.path} of task {scene.config.task!r}")
        if num_worlds < 1:
            raise ValueError(f"num_worlds must be >= 1, got {num_worlds}")
        self._num_worlds = num_worlds
        self._episode_steps = scene.config.episode_steps
        self._steps_done = -1
        self._restarted = np.zeros(num_worlds, dtype=bool)

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

    @property
    def capabilities(self) -> EnvCapabilities:
        """What it can do beyond :class:`BatchedEnv`, by the hooks its class defines: falls
        (``_fallen_worlds``), restarts (``_restart``); and the noise-free observation."""
        cls = type(self)
        return EnvCapabilities(falls=cls._fallen_worlds is not EpisodeWorlds._fallen_worlds,
                               restarts=cls._restart is not EpisodeWorlds._restart,
                               clean_observation=True)

    @property
    def restarted(self) -> np.ndarray:
        """Worlds restarted after a fall (or an end of their own) in the last step, by
        ``step(..., restart_fallen=True)``. Shape: (num_worlds,), bool."""
        return self._restarted.copy()

    def fallen(self) -> np.ndarray:
        """Whether each world's robot has fallen (or its environment terminated) since its
        episode (re)started. Shape: (num_worlds,), bool."""
        self._require_episode()
        return np.array(self._fallen_worlds(), dtype=bool)

    def respawn(self, worlds: np.ndarray | Sequence[int]) -> np.ndarray:
        """Restart some worlds mid-episode (a fallen robot, say) for training with per-world
        episodes; the others continue.

        Args:
            worlds: Indices of the worlds to restart, each in [0, num_worlds).

        Returns:
            Observations of every world after the restart. Shape: (N, obs_dim), float32.
        """
        idx = self._world_indices(worlds)
        if idx.size:
            self._restart(idx)
        return self._observe()

    def clean_observation(self) -> np.ndarray:
        """The observation without sensor noise (a teacher's). Shape: (N, obs_dim), float32."""
        self._require_episode()
        return np.asarray(self._clean_observation(), dtype=np.float32)

    def _fallen_worlds(self) -> np.ndarray:
        """Worlds whose robot is down (tasks where a robot can fall). Shape: (N,), bool."""
        return np.zeros(self._num_worlds, dtype=bool)

    def _restart(self, worlds: np.ndarray) -> None:
        """Fresh initial state for ``worlds`` (int64 indices); backends that support it."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart single worlds")

    def _observe(self) -> np.ndarray:
        """The observation of every world as a caller gets it. Shape: (N, obs_dim), float32."""
        raise NotImplementedError

    def _clean_observation(self) -> np.ndarray:
        """The noise-free observation. Shape: (N, obs_dim)."""
        raise NotImplementedError


class RobotEpisodes(EpisodeWorlds):
    """The episode loop of a simulated robot, written once for every physics backend.

    It owns the episode clock, action checking, clipping and delay, observation noise, the
    pushes on a floating base, per-world restarts and the record of each episode's
    conditions. A task (reach, locomotion, a plugin's) writes initial states, turns actions
    into controls and defines observation, reward, success and its expert through the task
    hooks below; a backend (MuJoCo, Isaac Lab) steps the robot model through the backend
    hooks. Every random draw comes from ``self._rng`` in a fixed order, so the same scene,
    world count and seed give the same draws on every backend.

    Task hooks: ``_reset_worlds``, ``_apply_action``, ``_after_step``, ``_reward``,
    ``_clean_observation``, ``success``, ``expert_action``, ``obs_dim``, ``act_dim`` and,
    for per-world restarts, ``_respawn_worlds``. Backend hooks: ``_begin_episode``,
    ``_settle``, ``_advance`` and, for pushes, ``_kick``.
    """

    _rand: RandomizationConfig
    _rng: np.random.Generator
    _control_dt: float
    _randomizes_model: bool
    _drawn: dict[str, np.ndarray]

    @property
    def capabilities(self) -> EnvCapabilities:
        """As every environment's, restarts where its task defines ``_respawn_worlds``; and
        it draws the scene's model randomization."""
        respawns = type(self)._respawn_worlds is not RobotEpisodes._respawn_worlds
        return replace(super().capabilities, restarts=respawns, model_draws=True)

    def _start_robot(self, scene: Scene, task_name: str, num_worlds: int, seed: int,
                     control_hz: float) -> None:
        """Set up the loop for ``num_worlds`` worlds of ``scene`` at ``control_hz`` (Hz), all
        draws from ``np.random.default_rng(seed)``."""
        self._start_worlds(scene, task_name, num_worlds)
        rand = scene.config.randomization
        self._rand = rand
        self._rng = np.random.default_rng(seed)
        self._control_dt = 1.0 / control_hz
        self._randomizes_model = randomizes_model(rand)
        self._drawn = {}
        self._looked: dict[str, np.ndarray] = {}
        self._pushes = np.zeros(num_worlds, np.int64)
        self._next_push = np.zeros(num_worlds, dtype=np.int64)
        self._pending: deque[np.ndarray] = deque()

    def reset(self) -> np.ndarray:
        """Draw randomization and initial state per world and start a new episode.

        Returns:
            Observations. Shape: (num_worlds, obs_dim), float32.
        """
        self._pushes[:] = 0
        self._begin_episode()
        self._reset_worlds()
        self._settle(None)
        self._sense()
        self._pending = deque(
            np.zeros((self._num_worlds, self.act_dim)) for _ in range(self._rand.action_delay_steps)
        )
        interval = self._rand.push_interval_steps
        if interval is not None:
            self._next_push = self._rng.integers(interval[0], interval[1] + 1,
                                                 size=self._num_worlds)
        self._begin_look()
        self._steps_done = 0
        return self._observe()

    def step(
        self, actions: np.ndarray, *, restart_fallen: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Apply one control step in every world.

        Args:
            actions: Normalized actions, clipped to [-1, 1]. Shape: (num_worlds, act_dim).
            restart_fallen: Restart the worlds whose robot fell in this step, as
                :meth:`respawn` does, before observing (not on the episode's last step, which
                the caller ends with :meth:`reset`); :attr:`restarted` tells which.

        Returns:
            ``(obs, reward, done)``: shape (num_worlds, obs_dim) float32, (num_worlds,) float32
            and (num_worlds,) bool, True for every world at the last step of the episode.
        """
        actions = self._checked_actions(actions)
        chosen = np.clip(actions, -1.0, 1.0)
        applied = chosen
        if self._pending:
            self._pending.append(chosen)
            applied = self._pending.popleft()
        self._apply_action(chosen, applied)
        if self._rand.push_interval_steps is not None:
            self._push()
        self._advance()
        self._sense()
        self._steps_done += 1
        self._after_step()
        reward = self._reward().astype(np.float32)
        done = np.full(self._num_worlds, self._steps_done >= self._episode_steps)
        self._restarted = np.zeros(self._num_worlds, dtype=bool)
        if restart_fallen and not done[0]:
            fell = np.flatnonzero(self._fallen_worlds())
            if fell.size:
                self._restart(fell)
                self._restarted[fell] = True
        return self._observe(), reward, done

    def episode_conditions(self) -> dict[str, np.ndarray]:
        """Every randomized factor of the current episode, one value per world: the model's
        draws (mass, damping, friction and gain factors averaged over the bodies, degrees of
        freedom or actuators they scale; the payload; the contact-friction factor), the
        observation noise and action delay, the pushes so far, the visual variation the scene
        sets (:meth:`_draw_look`) and the episode's target.

        Returns:
            Name -> shape (num_worlds,), float64 (:meth:`condition_units`).
        """
        self._require_episode()
        n, rand = self._num_worlds, self._rand
        ones = np.ones(n)
        out = {
            "mass_scale": ones, "payload_mass": ones * 0.0, "damping_scale": ones,
            "friction_scale": ones, "gain_scale": ones, "contact_friction_scale": ones,
            **self._drawn,
            "obs_noise_std": ones * rand.obs_noise_std,
            "action_delay_steps": ones * rand.action_delay_steps,
            "pushes": self._pushes.astype(np.float64),
            **self._looked,
        }
        values, names, _ = self._episode_target()
        out.update({f"target_{name}": values[:, i] for i, name in enumerate(names)})
        return {k: np.asarray(v, np.float64).copy() for k, v in out.items()}

    def condition_units(self) -> dict[str, str]:
        """The unit of every factor of :meth:`episode_conditions`."""
        _, names, units = self._episode_target()
        return {"mass_scale": "factor", "payload_mass": "kg", "damping_scale": "factor",
                "friction_scale": "factor", "gain_scale": "factor",
                "contact_friction_scale": "factor", "obs_noise_std": "obs units",
                "action_delay_steps": "control steps", "pushes": "count",
                **{f"target_{n}": u for n, u in zip(names, units, strict=True)},
                **{k: LOOK_UNITS.get(k, "0..1") for k in self._looked}}

    def _episode_target(self) -> tuple[np.ndarray, tuple[str, ...], tuple[str, ...]]:
        """The episode's drawn target per world, its axis names and units; none by default.
        Shape: (num_worlds, len(names))."""
        return np.zeros((self._num_worlds, 0)), (), ()

    def _draw_model(self, links: int, dofs: int, actuators: int) -> ModelDraws:
        """Draw this episode's model randomization for every world, in the one order every
        backend follows (mass, payload, damping, friction, gain, contact friction), and keep
        its per-world means for :meth:`episode_conditions`."""
        n, rand, rng = self._num_worlds, self._rand, self._rng
        draws = ModelDraws(
            mass=rng.uniform(*rand.mass_scale, size=(n, links)),
            payload=rng.uniform(*rand.payload_mass, size=n),
            damping=rng.uniform(*rand.damping_scale, size=(n, dofs)),
            friction=rng.uniform(*rand.friction_scale, size=(n, dofs)),
            gain=rng.uniform(*rand.gain_scale, size=(n, actuators)),
            contact=rng.uniform(*rand.contact_friction_scale, size=n),
        )
        self._drawn = {
            "mass_scale": draws.mass.mean(axis=1), "payload_mass": draws.payload,
            "damping_scale": draws.damping.mean(axis=1),
            "friction_scale": draws.friction.mean(axis=1),
            "gain_scale": draws.gain.mean(axis=1), "contact_friction_scale": draws.contact,
        }
        return draws

    def _draw_look(self, lights: int, cameras: int) -> LookDraws:
        """Draw this episode's visual variation for every world, only the fields the scene
        sets, in one order (light intensity, light tilts, geom colours in the scene's order,
        camera offsets, camera rotations), after every other draw of the reset; keep what
        :meth:`episode_conditions` records of it: ``light_intensity_scale``, ``light_tilt``
        (deg, mean over the ``lights``), ``colour_<geom>_red``/``_green``/``_blue``,
        ``camera_offset`` (m, the offset's length) and ``camera_rotation`` (deg), both means
        over the ``cameras``, and ``image_noise_std``."""
        n, rand, rng = self._num_worlds, self._rand, self._rng
        light_scale = light_tilt = offset = rotation = None
        looked: dict[str, np.ndarray] = {}
        if rand.light_intensity_scale != (1.0, 1.0):
            light_scale = rng.uniform(*rand.light_intensity_scale, size=n)
            looked["light_intensity_scale"] = light_scale
        if rand.light_direction_jitter and lights:
            tilt = rng.uniform(0.0, np.radians(rand.light_direction_jitter), size=(n, lights))
            light_tilt = np.stack([tilt, rng.uniform(0.0, 2.0 * np.pi, size=(n, lights))], -1)
            looked["light_tilt"] = np.degrees(tilt).mean(axis=1)
        colours = {name: rng.uniform(low, high, size=(n, 3))
                   for name, (low, high) in rand.geom_colours.items()}
        for name, rgb in colours.items():
            looked.update({f"colour_{name}_{c}": rgb[:, i] for i, c in enumerate(CHANNELS)})
        if rand.camera_pos_jitter and cameras:
            jitter = rand.camera_pos_jitter
            offset = rng.uniform(-jitter, jitter, size=(n, cameras, 3))
            looked["camera_offset"] = np.linalg.norm(offset, axis=-1).mean(axis=1)
        if rand.camera_angle_jitter and cameras:
            angle = rng.uniform(0.0, np.radians(rand.camera_angle_jitter), size=(n, cameras))
            rotation = _random_axes(rng, (n, cameras)) * angle[..., None]
            looked["camera_rotation"] = np.degrees(angle).mean(axis=1)
        if rand.image_noise_std:
            looked["image_noise_std"] = np.full(n, rand.image_noise_std)
        self._looked = looked
        return LookDraws(light_scale, light_tilt, colours, offset, rotation)

    def _restart(self, worlds: np.ndarray) -> None:
        """Fresh initial state and target for ``worlds``; their delayed actions dropped."""
        self._respawn_worlds(worlds)
        for pending in self._pending:
            pending[worlds] = 0.0

    def _respawn_worlds(self, worlds: np.ndarray) -> None:
        """Task hook: write a fresh initial state and target into ``worlds`` (tasks that
        support restarting single worlds)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart single worlds")

    def _observe(self) -> np.ndarray:
        """The observation of every world, noise included. Shape: (N, obs_dim), float32."""
        obs = self._clean_observation()
        if self._rand.obs_noise_std > 0.0:
            obs = obs + self._rng.normal(0.0, self._rand.obs_noise_std, size=obs.shape)
        return np.asarray(obs, dtype=np.float32)

    def _push(self) -> None:
        """Add a horizontal velocity of random direction and size to every base due a push."""
        due = np.flatnonzero(self._next_push == self._steps_done)
        if not due.size:
            return
        rand, rng = self._rand, self._rng
        speed = rng.uniform(*rand.push_velocity, size=due.size)
        heading = rng.uniform(0.0, 2.0 * np.pi, size=due.size)
        self._pushes[due] += 1
        self._kick(due, np.stack([speed * np.cos(heading), speed * np.sin(heading)], axis=1))
        if rand.push_interval_steps is not None:
            low, high = rand.push_interval_steps
            self._next_push[due] += rng.integers(low, high + 1, size=due.size)

    def _reset_worlds(self) -> None:
        """Task hook: draw the episode's targets and write every world's initial state."""
        raise NotImplementedError

    def _apply_action(self, chosen: np.ndarray, applied: np.ndarray) -> None:
        """Task hook: write controls for the step, given the actions the policy ``chosen``
        this step (clipped) and those ``applied`` now (``chosen`` of ``action_delay_steps``
        control steps ago). Shapes: (N, act_dim)."""
        raise NotImplementedError

    def _after_step(self) -> None:
        """Task hook: update the task's own bookkeeping from the new state."""
        raise NotImplementedError

    def _reward(self) -> np.ndarray:
        """Task hook: reward of the step just taken. Shape: (N,)."""
        raise NotImplementedError

    def _sense(self) -> None:
        """Task hook: read what the task keeps of the simulator's state (a typed state), at
        the initial states and after every step; nothing by default."""

    def _begin_episode(self) -> None:
        """Backend hook: draw the episode's model randomization (or restore the nominal
        model) and clear the simulator's state, before the task writes initial states."""
        raise NotImplementedError

    def _begin_look(self) -> None:
        """Backend hook: draw the episode's visual variation (:meth:`_draw_look`) where the
        backend renders it; by default none is drawn or recorded."""
        self._looked = {}

    def _settle(self, worlds: np.ndarray | None) -> None:
        """Backend hook: make the initial states the task wrote into ``worlds`` (None: all, at
        reset) current, without a step, so that the task reads them."""
        raise NotImplementedError

    def _advance(self) -> None:
        """Backend hook: advance every world one control step with the controls written."""
        raise NotImplementedError

    def _kick(self, worlds: np.ndarray, velocity: np.ndarray) -> None:
        """Backend hook: add ``velocity`` (m/s, world x and y; shape (len(worlds), 2)) to the
        floating base of each of ``worlds``."""
        raise NotImplementedError(f"{type(self).__name__}: pushes need a free-floating base")
