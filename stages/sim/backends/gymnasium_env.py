"""The worlds of a Gymnasium task (:mod:`stages.sim.backends.gymnasium_tasks`): N copies of its
environment as one :class:`~stages.sim.env.batched.BatchedEnv`, stepped in this process.

A :class:`gymnasium.vector.SyncVectorEnv` without autoreset: on 2 cores an ``AsyncVectorEnv``
(one process per world) stepped InvertedPendulum-v5 several times slower than the sync one,
since one step costs far less than passing it between processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from physai_core.errors import BackendUnavailableError, PhysaiError, UnknownNameError
from stages.core.units import ActionRange
from stages.sim.env.bodies import BodyLayout, mujoco_layout, mujoco_poses
from stages.sim.env.capabilities import EnvCapabilities
from stages.sim.env.vector_env import VectorEpisodes

if TYPE_CHECKING:
    import gymnasium

    from stages.sim.scenes.scene import Scene


CAMERA = "rgb_array"
"""The one view a Gymnasium task renders: the environment's own ``rgb_array`` frame."""

class GymEnvError(UnknownNameError):
    """A ``gymnasium:<id>`` task that cannot be had: an unknown id (the message lists the close
    matches), a module prefix that does not import, or an environment that fails to build."""

    def __init__(self, message: str) -> None:
        self.message = " ".join(message.split())
        Exception.__init__(self, self.message)


def _gymnasium() -> Any:
    """The ``gymnasium`` module, or a clear error naming the extra that installs it."""
    try:
        import gymnasium
    except ImportError as exc:
        raise BackendUnavailableError("gymnasium", "gymnasium", exc) from None
    return gymnasium


def _first_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _make(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """``gymnasium.make(env_id, **kwargs)``; any failure is a one-line GymEnvError."""
    gym = _gymnasium()
    try:
        return gym.make(env_id, **kwargs)
    except Exception as exc:
        raise GymEnvError(f"Gymnasium environment {env_id!r} cannot be made with {kwargs}: "
                          f"{_first_line(exc)}") from None


def _bounded_action_box(env_id: str, space: gymnasium.Space) -> tuple[np.ndarray, np.ndarray]:
    """The finite low and high of a Box action space, flattened; anything else is an error."""
    from gymnasium import spaces

    if not isinstance(space, spaces.Box):
        raise GymEnvError(f"Gymnasium environment {env_id!r} has action space {space}; the "
                          "pipeline's policies act in a bounded Box")
    low = np.asarray(space.low, np.float64).reshape(-1)
    high = np.asarray(space.high, np.float64).reshape(-1)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise GymEnvError(f"Gymnasium environment {env_id!r} has an unbounded action Box "
                          f"{space}; normalized actions need finite low and high")
    return low, high


def _vector_env(env_id: str, num_worlds: int, kwargs: dict[str, Any],
                seeds: list[int] | None = None) -> Any:
    """``num_worlds`` copies of ``env_id`` made with ``kwargs`` (world i with ``seed=seeds[i]``
    too, when ``seeds`` are given), observations flattened to one vector, stepped in this
    process without automatic resets."""
    from gymnasium import spaces, wrappers
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    def maker(extra: dict[str, Any]) -> Any:
        def make_one() -> gymnasium.Env:
            env = _make(env_id, **kwargs, **extra)
            space = env.observation_space
            if not (isinstance(space, spaces.Box) and len(space.shape) == 1):
                env = wrappers.FlattenObservation(env)
            return env
        return make_one

    makers = [maker({} if seeds is None else {"seed": seeds[i]}) for i in range(num_worlds)]
    return SyncVectorEnv(makers, autoreset_mode=AutoresetMode.DISABLED)


class GymBatchedEnv(VectorEpisodes):
    """N copies of a Gymnasium environment as a :class:`~stages.sim.env.batched.BatchedEnv`.

    Actions in [-1, 1] are scaled to the action Box's low and high (the task's
    :class:`~stages.core.units.ActionRange`, read from this scene's environment); Dict (and other
    structured) observations are flattened with ``gymnasium.spaces.flatten`` in the space's
    own order. Every episode lasts the scene's ``episode_steps``; a world that terminates
    earlier stays as it ended (its observation, info and return frozen) until the others are
    done (:class:`~stages.sim.env.vector_env.VectorEpisodes`). :meth:`respawn`, :meth:`fallen` and
    ``step(..., restart_fallen=True)`` give PPO training per-world episodes instead.

    World i of seed s draws its initial states from ``SeedSequence(s)``'s i-th number, so
    environments of neighbouring seeds share no world; with the scene's ``seed_at_make`` the
    world's environment is also made with that number as its ``seed`` make kwarg.
    """

    _family: ClassVar[str] = "a Gymnasium task"

    _render_failure: ClassVar[str | None] = None
    """Why the first rendering of this process failed, if it did: OpenGL is not retried."""

    def __init__(
        self,
        scene: Scene,
        num_worlds: int,
        seed: int,
        *,
        task_name: str,
        env_id: str,
        renderable: bool,
    ) -> None:
        """Build ``num_worlds`` copies of ``env_id`` for ``scene``; call reset() next.

        Args:
            scene: A scene of task ``task_name``; its make_kwargs go to ``gymnasium.make``.
            num_worlds: Worlds N stepped together (>= 1).
            seed: Seed of the worlds' first reset; later resets continue their generators.
            task_name: The task id, ``gymnasium:<rest>``.
            env_id: The Gymnasium id it resolves to.
            renderable: Whether the environment has the ``rgb_array`` render mode.
        """
        from gymnasium import spaces

        config = scene.config
        self._start_worlds(scene, task_name, num_worlds)
        if config.success is None:
            raise ValueError(f"scene {scene.path} names no success predicate")
        self._task = task_name
        self._env_id = env_id
        self._renderable = renderable
        self._make_kwargs = dict(config.make_kwargs)
        self._conditions = {k: float(v) for k, v in config.make_kwargs.items()
                            if isinstance(v, int | float) and not isinstance(v, bool)}
        world_seeds = [int(s) for s in np.random.SeedSequence(seed).generate_state(num_worlds)]
        self._vec = _vector_env(env_id, num_worlds, {
            **config.make_kwargs, "max_episode_steps": config.episode_steps,
            "render_mode": CAMERA if renderable else None},
            world_seeds if config.seed_at_make else None)
        low, high = _bounded_action_box(env_id, self._vec.single_action_space)
        self._start_vector(spaces.flatdim(self._vec.single_observation_space), int(low.size),
                           config.success)
        self._seeds: list[int | None] = list(world_seeds)
        n = num_worlds
        self._ended_at = np.zeros(n, np.int64)
        self._needs_reset = np.zeros(n, bool)
        self._info: list[object | None] = [None] * n
        self._info_keys: set[str] = set()
        # The step's hot path: precomputed scales and shapes, and a flag that spares it the
        # masked reset while no world needs one.
        native = ActionRange.of(low, high)
        self._half_span = native.half_span
        self._mid = native.mid
        self._scaled = np.zeros((n, int(low.size)), np.float64)
        self._vec_action_shape = self._vec.action_space.shape
        self._vec_action_dtype = self._vec.action_space.dtype
        self._any_needs_reset = False
        self._filmed: set[int] = set()
        self._pose_scratch: Any = None
        self._film_size: tuple[int, int] | None = None
        self._final_frames: dict[int, np.ndarray] = {}

    @property
    def make_kwargs(self) -> dict[str, Any]:
        """The scene's make kwargs (which of a benchmark's tasks it is), as a Python expert's
        factory is given them (:mod:`stages.policies.python_code`)."""
        return dict(self._make_kwargs)

    def _vector_reset(self) -> np.ndarray:
        """Reset every world (seeded the first time). Shape: (num_worlds, obs_dim), float32."""
        obs, info = self._vec.reset(seed=self._seeds)
        self._seeds = [None] * self._num_worlds
        self._needs_reset[:] = False
        self._any_needs_reset = False
        self._final_frames.clear()
        self._record_info(info, self._everyone)
        return self._flat(obs)

    def _vector_step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, None]:
        """Scale the actions to the Box and step every world, first resetting those whose
        environment ended in the last step (their observations are not read until the episode
        ends or they restart). An ended world's observation is its final one, so no
        ``final_obs`` is given."""
        scaled = np.multiply(actions, self._half_span, out=self._scaled)
        scaled += self._mid
        if self._any_needs_reset:
            self._vec.reset(options={"reset_mask": self._needs_reset.copy()})
        obs, reward, terminated, truncated, info = self._vec.step(
            scaled.reshape(self._vec_action_shape).astype(self._vec_action_dtype))
        self._record_info(info, self._live())
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        self._needs_reset = terminated | truncated
        self._any_needs_reset = bool(self._needs_reset.any())
        return (np.asarray(obs).reshape(self._num_worlds, self._obs_dim),
                np.asarray(reward, np.float64), terminated, truncated, None)

    def _reset_worlds(self, mask: np.ndarray) -> np.ndarray:
        """Fresh episodes in the worlds of ``mask``; the other worlds are untouched."""
        obs, info = self._vec.reset(options={"reset_mask": mask.copy()})
        self._needs_reset[mask] = False
        self._any_needs_reset = bool(self._needs_reset.any())
        self._record_info(info, mask)
        return self._flat(obs)

    def _clear(self, mask: np.ndarray) -> None:
        """Forget the episode statistics (and the kept info value) of the worlds of ``mask``."""
        super()._clear(mask)
        for world in np.flatnonzero(mask):
            self._info[world] = None

    def _worlds_ended(self, mask: np.ndarray) -> None:
        """Note the step the worlds of ``mask`` ended at, and keep the last frame of those being
        filmed before their environment is reset."""
        self._ended_at[mask] = self._steps_done
        self._film_final_frames(np.flatnonzero(mask))

    def _info_success(self) -> np.ndarray:
        """The ``info`` predicate: the kept info value of each world is truthy, or lies within
        ``min`` and ``max``. Shape: (num_worlds,), bool."""
        rule = self._success
        key = rule.info
        reported = {k for k in self._info_keys if not k.startswith("_")}
        if key not in reported:
            seen = ", ".join(sorted(reported)) or "(none)"
            raise PhysaiError(f"{self._task}: the success predicate reads info[{key!r}], which "
                              f"the environment never reported; its info keys: {seen}")
        if rule.min is None and rule.max is None:
            return np.array([v is not None and bool(np.all(np.asarray(v))) for v in self._info],
                            bool)
        return np.array([self._within(v) for v in self._info], bool)

    def _within(self, value: object) -> bool:
        """Whether an info value is a number within the predicate's min and max."""
        if value is None:
            return False
        arr = np.asarray(value)
        if arr.size != 1 or not np.issubdtype(arr.dtype, np.number):
            raise PhysaiError(f"{self._task}: info[{self._success.info!r}] is {value!r}, not "
                              "a number to compare with min or max")
        x = float(arr.reshape(-1)[0])
        rule = self._success
        return (rule.min is None or x >= rule.min) and (rule.max is None or x <= rule.max)

    def episode_conditions(self) -> dict[str, np.ndarray]:
        """The scene's numeric make_kwargs, the same for every world (Gymnasium environments
        draw their own initial states, which they do not report).

        Returns:
            Name -> shape (num_worlds,), float64.
        """
        return {k: np.full(self._num_worlds, v) for k, v in self._conditions.items()}

    def condition_units(self) -> dict[str, str]:
        """Units of the make_kwargs: not known to the adapter."""
        return dict.fromkeys(self._conditions, "")

    def episode_miss(self) -> tuple[np.ndarray, str]:
        """Control steps the world fell short of the episode's end (0 if it never ended
        early). Shape: (num_worlds,)."""
        self._require_episode()
        short = np.where(self._ended, self._episode_steps - self._ended_at, 0)
        return short.astype(np.float64), "control steps"

    def render(self, worlds: Sequence[int], width: int, height: int, camera: str) -> np.ndarray:
        """Render some worlds with the environment's ``rgb_array`` mode, cut and resized.

        A world that has ended shows its last frame. MuJoCo environments need an offscreen
        OpenGL backend chosen before ``mujoco`` is first imported, e.g. ``MUJOCO_GL=egl``.

        Args:
            worlds: Indices of the worlds to render, each in [0, num_worlds).
            width: Image width (pixels).
            height: Image height (pixels).
            camera: :data:`CAMERA`, the only view.

        Returns:
            RGB frames. Shape: (len(worlds), height, width, 3), uint8.
        """
        self._require_episode()
        if camera != CAMERA:
            raise ValueError(f"unknown camera {camera!r}; valid: {CAMERA}")
        if not self._renderable:
            raise RuntimeError(f"{self._env_id} has no rgb_array render mode")
        bad = [w for w in worlds if not 0 <= w < self._num_worlds]
        if bad:
            raise ValueError(f"worlds must be in [0, {self._num_worlds}), got {bad}")
        if width < 1 or height < 1:
            raise ValueError(f"image size must be positive, got {width} x {height}")
        self._filmed.update(worlds)
        self._film_size = (width, height)
        frames = np.empty((len(worlds), height, width, 3), dtype=np.uint8)
        for k, world in enumerate(worlds):
            final = self._final_frames.get(world)
            if self._ended[world] and final is not None and final.shape[:2] == (height, width):
                frames[k] = final
            else:
                frames[k] = self._frame(world, width, height)
        return frames

    @property
    def capabilities(self) -> EnvCapabilities:
        """As every vector env's, its bodies (:meth:`body_layout`; None where the environment
        is not MuJoCo's) and the make kwargs it was made with (:attr:`make_kwargs`)."""
        return replace(super().capabilities, body_layout=True, make_kwargs=True)

    def body_layout(self) -> BodyLayout | None:
        """The bodies and visible geoms of a MuJoCo environment's model; None for another."""
        model = getattr(self._vec.envs[0].unwrapped, "model", None)
        if type(model).__name__ != "MjModel":
            return None
        return mujoco_layout(model)

    def body_poses(self, worlds: list[int]) -> np.ndarray:
        """Every body's world pose in each of ``worlds`` (MuJoCo environments only).

        Returns:
            Shape: (len(worlds), bodies, 7), float64.
        """
        self._require_episode()
        bad = [w for w in worlds if not 0 <= w < self._num_worlds]
        if bad:
            raise ValueError(f"worlds must be in [0, {self._num_worlds}), got {bad}")
        import mujoco

        poses = []
        for world in worlds:
            env: Any = self._vec.envs[world].unwrapped
            data = getattr(env, "data", None)
            if type(data).__name__ != "MjData":
                raise TypeError(f"{self._env_id} is not a MuJoCo environment")
            if self._pose_scratch is None:
                self._pose_scratch = mujoco.MjData(env.model)
            poses.append(mujoco_poses(env.model, data, self._pose_scratch))
        return np.stack(poses)

    def close(self) -> None:
        """Close every world's environment."""
        self._vec.close()

    def _frame(self, world: int, width: int, height: int) -> np.ndarray:
        """One world's frame at ``width`` x ``height``: the centre of the environment's frame
        cut to that aspect ratio, resized nearest-neighbour."""
        if GymBatchedEnv._render_failure is not None:
            raise RuntimeError(GymBatchedEnv._render_failure)
        try:
            image = np.asarray(self._vec.envs[world].render())
        except Exception as exc:
            GymBatchedEnv._render_failure = (
                f"rendering {self._env_id} failed ({_first_line(exc)}); for MuJoCo set "
                "MUJOCO_GL=egl (or osmesa) before mujoco is imported")
            raise RuntimeError(GymBatchedEnv._render_failure) from exc
        if image.ndim != 3 or image.shape[2] < 3:
            raise RuntimeError(f"{self._env_id} rendered shape {image.shape}, not an RGB image")
        src_h, src_w = image.shape[:2]
        crop_h, crop_w = min(src_h, src_w * height // width), min(src_w, src_h * width // height)
        top, left = (src_h - crop_h) // 2, (src_w - crop_w) // 2
        rows = top + np.arange(height) * crop_h // height
        cols = left + np.arange(width) * crop_w // width
        return np.ascontiguousarray(image[rows][:, cols, :3], dtype=np.uint8)

    def _film_final_frames(self, ended: np.ndarray) -> None:
        """Keep the last frame of ended worlds that are being filmed, before they move on."""
        if self._film_size is None:
            return
        for world in ended:
            if int(world) in self._filmed:
                try:
                    self._final_frames[int(world)] = self._frame(int(world), *self._film_size)
                except RuntimeError:
                    return

    def _record_info(self, info: dict[str, Any], worlds: np.ndarray) -> None:
        """Keep the predicate's info value of ``worlds`` from a vector env's info."""
        self._info_keys.update(info)
        key = self._success.info
        if key is None or key not in info:
            return
        values = info[key]
        present = np.asarray(info.get(f"_{key}", np.ones(self._num_worlds, bool)), bool)
        for world in np.flatnonzero(worlds & present):
            self._info[world] = values[world]

    def _flat(self, obs: Any) -> np.ndarray:
        """Batched observations as float32. Shape: (num_worlds, obs_dim)."""
        return np.asarray(obs, np.float64).reshape(self._num_worlds, self._obs_dim) \
            .astype(np.float32)

