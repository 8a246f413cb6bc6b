"""What every MuJoCo task shares: N worlds stepped in C across threads, randomization, rendering.

All worlds of an environment live in one :class:`mujoco.batch.Batch`: each world is one row of
the batch's state array (time, joint positions and velocities, actuator state, solver warm
start, controls, applied forces, mocap poses), and one control step is a single call that runs
``frame_skip`` ``mj_step`` calls for every world on a pool of C threads. Randomized model
parameters (masses, damping, friction, gains) are per-world copies of only those fields inside
the batch, so no world needs a model of its own. Results are bit-identical to stepping one
``MjData`` per world in a Python loop, at any thread count.

Policy evaluation stays outside: the caller computes the actions of all N worlds in one batched
call per control step and passes them to :meth:`MujocoBatchedEnv.step`.
"""

from __future__ import annotations

import copy
import os
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from stages.sim.batched import EpisodeWorlds, randomizes_model
from stages.sim.bodies import BodyLayout, mujoco_layout, mujoco_poses

if TYPE_CHECKING:
    import mujoco
    from mujoco import batch as mjbatch

    from stages.sim.scene import Scene

THREADS_ENV = "PHYSAI_SIM_THREADS"
"""Environment variable that sets the number of stepping threads (default: every CPU)."""


def default_num_threads() -> int:
    """Stepping threads: ``$PHYSAI_SIM_THREADS`` when set, else ``os.cpu_count()``."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return os.cpu_count() or 1
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{THREADS_ENV} must be a positive integer, got {value!r}")
    return int(value)


def _load_model(model_path: Path, num_worlds: int, num_threads: int | None, frame_skip: int,
                control_hz: float) -> tuple[mujoco.MjModel, int]:
    """The task's model, checked against its control rate, and the C threads to step it
    with; refuses a world or thread count under one."""
    import mujoco

    if num_worlds < 1:
        raise ValueError(f"num_worlds must be >= 1, got {num_worlds}")
    threads = default_num_threads() if num_threads is None else num_threads
    if threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {threads}")
    model = mujoco.MjModel.from_xml_path(str(model_path))
    if abs(model.opt.timestep * frame_skip * control_hz - 1.0) > 1e-9:
        raise ValueError(
            f"{model_path}: timestep {model.opt.timestep} s != 1 / ({control_hz} Hz * "
            f"{frame_skip})"
        )
    return model, threads


class MujocoBatchedEnv(EpisodeWorlds, ABC):
    """Base of every MuJoCo task: the :class:`~stages.sim.batched.BatchedEnv` plumbing.

    The base owns the batch, the episode clock, action checking, clipping and delay,
    observation noise, the model randomization drawn at every reset (mass, payload, joint
    damping and friction, actuator gain, contact friction), pushes on a floating base, and
    offscreen rendering. A task subclass writes initial states, turns actions into controls,
    and defines observation, reward, success and the scripted expert.

    Every random draw comes from ``np.random.default_rng(seed)`` in a fixed order, so the same
    scene, world count and seed give identical observations, whatever the thread count.
    """

    _offscreen_failure: ClassVar[str | None] = None
    """Why the first renderer of this process could not be created, if it could not: OpenGL
    is not retried, since a second attempt after a failed one can abort the process."""

    def __init__(
        self,
        scene: Scene,
        num_worlds: int,
        seed: int,
        *,
        task_name: str,
        model_path: Path,
        frame_skip: int,
        control_hz: float,
        payload_body: str,
        step_stage: mujoco.mjtStage | None = None,
        num_threads: int | None = None,
    ) -> None:
        """Load the model and build ``num_worlds`` worlds for ``scene``; call reset() next.

        Args:
            scene: A scene of task ``task_name``.
            num_worlds: Worlds N stepped together (>= 1).
            seed: Seed of every random draw (randomization, initial states, noise, pushes).
            task_name: The task id the subclass implements.
            model_path: The task's MJCF file.
            frame_skip: Physics steps per control step.
            control_hz: Control rate (Hz); must equal 1 / (timestep * frame_skip).
            payload_body: Body that the scene's payload mass is added to.
            step_stage: Forward stages recomputed at the new state after every control step,
                for the derived fields (site positions, say) that the subclass reads.
            num_threads: C threads stepping the worlds; None: :func:`default_num_threads`.
        """
        import mujoco
        from mujoco import batch as mjbatch

        if scene.config.task != task_name:
            raise ValueError(
                f"{task_name} cannot run scene {scene.path} of task {scene.config.task!r}"
            )
        model, threads = _load_model(model_path, num_worlds, num_threads, frame_skip,
                                     control_hz)
        self._model = model
        self._rand = scene.config.randomization
        self._num_worlds = num_worlds
        self._episode_steps = scene.config.episode_steps
        self._frame_skip = frame_skip
        self._control_dt = 1.0 / control_hz
        self._step_stage = mujoco.mjtStage.mjSTAGE_NONE if step_stage is None else step_stage
        self._rng = np.random.default_rng(seed)
        self._drawn: dict[str, np.ndarray] = {}
        self._pushes = np.zeros(num_worlds, np.int64)

        self._batch = mjbatch.Batch(model, num_worlds, nthread=threads)
        self._qpos = self._batch.bind("qpos")
        self._qvel = self._batch.bind("qvel")
        self._ctrl = self._batch.bind("ctrl")

        self._links = np.flatnonzero(model.body_dofnum > 0)
        self._payload_body = model.body(payload_body).id
        free = np.flatnonzero(model.jnt_type == mujoco.mjtJoint.mjJNT_FREE)
        self._free_dof = int(model.jnt_dofadr[free[0]]) if free.size else -1
        rand = self._rand
        if rand.push_interval_steps is not None and self._free_dof < 0:
            raise ValueError(f"{model_path}: pushes need a free-floating base")
        self._randomizes_model = randomizes_model(rand)

        self._pending: deque[np.ndarray] = deque()
        self._next_push = np.zeros(num_worlds, dtype=np.int64)
        self._steps_done = -1
        self._restarted = np.zeros(num_worlds, dtype=bool)
        self._render_model: mujoco.MjModel | None = None
        self._render_data: mujoco.MjData | None = None
        self._renderer: mujoco.Renderer | None = None

    @property
    @abstractmethod
    def obs_dim(self) -> int:
        """Length of one world's observation vector."""

    @property
    @abstractmethod
    def act_dim(self) -> int:
        """Length of one world's action vector."""

    @property
    def frame_skip(self) -> int:
        """Physics steps (count) per control step."""
        return self._frame_skip

    @property
    def batch(self) -> mjbatch.Batch:
        """The batch that holds and steps every world; world i is simulation i."""
        return self._batch

    def reset(self) -> np.ndarray:
        """Draw randomization and initial state per world and start a new episode.

        Returns:
            Observations. Shape: (num_worlds, obs_dim), float32.
        """
        import mujoco

        if self._randomizes_model:
            self._randomize_model()
        else:
            self._drawn = {}
        self._pushes[:] = 0
        self._batch.reset(stage=mujoco.mjtStage.mjSTAGE_NONE)
        self._reset_worlds()
        self._batch.forward(stage=self._step_stage)
        self._pending = deque(
            np.zeros((self._num_worlds, self.act_dim)) for _ in range(self._rand.action_delay_steps)
        )
        if self._rand.push_interval_steps is not None:
            self._next_push = self._rng.integers(
                self._rand.push_interval_steps[0],
                self._rand.push_interval_steps[1] + 1,
                size=self._num_worlds,
            )
        self._steps_done = 0
        return self._observe()

    def step(
        self, actions: np.ndarray, *, restart_fallen: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Apply one control step (``frame_skip`` physics steps) in every world.

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
        self._batch.step(nstep=self._frame_skip, stage=self._step_stage)
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

    @property
    def restarted(self) -> np.ndarray:
        """Worlds restarted after a fall in the last step. Shape: (num_worlds,), bool."""
        return self._restarted.copy()

    def _fallen_worlds(self) -> np.ndarray:
        """Worlds whose robot is down (tasks where a robot can fall). Shape: (N,), bool."""
        return np.zeros(self._num_worlds, dtype=bool)

    def clean_observation(self) -> np.ndarray:
        """The observation without the scene's sensor noise: what a privileged teacher sees.

        Returns:
            Shape: (num_worlds, obs_dim), float32.
        """
        self._require_episode()
        return self._clean_observation().astype(np.float32)

    def respawn(self, worlds: np.ndarray) -> np.ndarray:
        """Restart some worlds mid-episode (a fallen robot, say) for training with per-world
        episodes; the others continue, and every world keeps its drawn model parameters.

        Args:
            worlds: Indices of the worlds to restart, each in [0, num_worlds).

        Returns:
            Observations of every world after the restart. Shape: (num_worlds, obs_dim),
            float32.
        """
        idx = self._world_indices(worlds)
        if idx.size:
            self._restart(idx)
        return self._observe()

    def _restart(self, worlds: np.ndarray) -> None:
        """Fresh initial state and target for ``worlds``; their delayed actions dropped."""
        self._respawn_worlds(worlds)
        for pending in self._pending:
            pending[worlds] = 0.0

    def _respawn_worlds(self, worlds: np.ndarray) -> None:
        """Write a fresh initial state and target into ``worlds`` (tasks that support it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart single worlds")

    @abstractmethod
    def success(self) -> np.ndarray:
        """The task's success predicate. Shape: (num_worlds,), bool."""

    @abstractmethod
    def expert_action(self) -> np.ndarray:
        """The scripted expert's action for the true state. Shape: (num_worlds, act_dim)."""

    def render(self, worlds: Sequence[int], width: int, height: int, camera: str) -> np.ndarray:
        """Render the current state of some worlds offscreen, shadows and reflections off.

        Needs an offscreen OpenGL backend chosen before ``mujoco`` is first imported, e.g.
        ``MUJOCO_GL=egl`` in the environment. The renderer is created on the first call and
        reused while the image size stays the same.

        Args:
            worlds: Indices of the worlds to render, each in [0, num_worlds).
            width: Image width (pixels), at most the model's offscreen width.
            height: Image height (pixels), at most the model's offscreen height.
            camera: Name of a camera of the model.

        Returns:
            RGB frames. Shape: (len(worlds), height, width, 3), uint8.
        """
        import mujoco

        self._require_episode()
        model = self._model
        cameras = [model.camera(i).name for i in range(model.ncam)]
        if camera not in cameras:
            raise ValueError(f"unknown camera {camera!r}; valid: {', '.join(cameras)}")
        bad = [w for w in worlds if not 0 <= w < self._num_worlds]
        if bad:
            raise ValueError(f"worlds must be in [0, {self._num_worlds}), got {bad}")
        renderer = self._renderer_of_size(width, height)
        if self._render_model is None or self._render_data is None:
            self._render_model = copy.copy(self._model)
            self._render_data = mujoco.MjData(self._render_model)
        frames = np.empty((len(worlds), height, width, 3), dtype=np.uint8)
        for k, world in enumerate(worlds):
            if self._randomizes_model:
                self._batch.get_model(world, self._render_model)
            self._batch.get_data(world, self._render_data)
            mujoco.mj_forward(self._render_model, self._render_data)
            renderer.update_scene(self._render_data, camera=camera)
            renderer.render(out=frames[k])
        return frames

    def body_layout(self) -> BodyLayout:
        """The model's bodies and visible geoms (see :class:`~stages.sim.bodies.RecordsBodies`)."""
        return mujoco_layout(self._model)

    def body_poses(self, worlds: list[int]) -> np.ndarray:
        """Every body's world pose in each of ``worlds``. Shape: (len(worlds), bodies, 7)."""
        import mujoco

        self._require_episode()
        bad = [w for w in worlds if not 0 <= w < self._num_worlds]
        if bad:
            raise ValueError(f"worlds must be in [0, {self._num_worlds}), got {bad}")
        if self._render_model is None or self._render_data is None:
            self._render_model = copy.copy(self._model)
            self._render_data = mujoco.MjData(self._render_model)
        poses = np.empty((len(worlds), self._model.nbody, 7), dtype=np.float64)
        for k, world in enumerate(worlds):
            self._batch.get_data(world, self._render_data)
            poses[k] = mujoco_poses(self._render_model, self._render_data)
        return poses

    def episode_conditions(self) -> dict[str, np.ndarray]:
        """Every randomized factor of the current episode, one value per world: the model's
        draws (mass, damping, friction and gain factors averaged over the bodies, degrees of
        freedom or actuators they scale; the payload; the contact-friction factor), the
        observation noise and action delay, the pushes so far and the episode's target.

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
                **{f"target_{n}": u for n, u in zip(names, units, strict=True)}}

    def _episode_target(self) -> tuple[np.ndarray, tuple[str, ...], tuple[str, ...]]:
        """The episode's drawn target per world, its axis names and units; none by default.
        Shape: (num_worlds, len(names))."""
        return np.zeros((self._num_worlds, 0)), (), ()

    def close(self) -> None:
        """Release the renderer's OpenGL context, if one was created."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    @abstractmethod
    def _reset_worlds(self) -> None:
        """Draw the episode's targets and write every world's initial state into the batch."""

    @abstractmethod
    def _apply_action(self, chosen: np.ndarray, applied: np.ndarray) -> None:
        """Write controls for the step.

        Args:
            chosen: The actions the policy chose this step, clipped. Shape: (N, act_dim).
            applied: The actions that take effect now (``chosen`` of ``action_delay_steps``
                control steps ago). Shape: (N, act_dim).
        """

    @abstractmethod
    def _after_step(self) -> None:
        """Update the task's own bookkeeping from the new state."""

    @abstractmethod
    def _reward(self) -> np.ndarray:
        """Reward of the step just taken. Shape: (N,)."""

    @abstractmethod
    def _clean_observation(self) -> np.ndarray:
        """The noise-free observation. Shape: (N, obs_dim), float64."""

    def _observe(self) -> np.ndarray:
        """The observation of every world, noise included. Shape: (N, obs_dim), float32."""
        obs = self._clean_observation()
        if self._rand.obs_noise_std > 0.0:
            obs = obs + self._rng.normal(0.0, self._rand.obs_noise_std, size=obs.shape)
        return obs.astype(np.float32)

    def _push(self) -> None:
        """Add a horizontal velocity of random direction and size to every base due a push."""
        due = np.flatnonzero(self._next_push == self._steps_done)
        if not due.size:
            return
        rand, rng = self._rand, self._rng
        speed = rng.uniform(*rand.push_velocity, size=due.size)
        heading = rng.uniform(0.0, 2.0 * np.pi, size=due.size)
        dof = self._free_dof
        self._pushes[due] += 1
        self._qvel[due, dof] += speed * np.cos(heading)
        self._qvel[due, dof + 1] += speed * np.sin(heading)
        if rand.push_interval_steps is not None:
            low, high = rand.push_interval_steps
            self._next_push[due] += rng.integers(low, high + 1, size=due.size)

    def _randomize_model(self) -> None:
        """Draw per-world model parameters and write them into the batch's per-world fields.

        Mass factors scale each moving body's mass and inertia; the payload is added to the
        payload body with its inertia scaled alike; gravity compensation keeps the nominal
        masses. Damping and friction factors are per degree of freedom, gain factors per
        actuator (stiffness kp and the matching bias term), and one contact-friction factor per
        world scales the sliding friction of every geom.
        """
        n, rand, rng, base, b = self._num_worlds, self._rand, self._rng, self._model, self._batch
        links = self._links
        mass = rng.uniform(*rand.mass_scale, size=(n, links.size))
        payload = rng.uniform(*rand.payload_mass, size=n)
        damping = rng.uniform(*rand.damping_scale, size=(n, base.nv))
        friction = rng.uniform(*rand.friction_scale, size=(n, base.nv))
        gain = rng.uniform(*rand.gain_scale, size=(n, base.nu))
        contact = rng.uniform(*rand.contact_friction_scale, size=n)
        self._drawn = {
            "mass_scale": mass.mean(axis=1), "payload_mass": payload,
            "damping_scale": damping.mean(axis=1), "friction_scale": friction.mean(axis=1),
            "gain_scale": gain.mean(axis=1), "contact_friction_scale": contact,
        }

        body_scale = np.ones((n, base.nbody))
        body_scale[:, links] = mass
        body_mass = base.body_mass * body_scale
        body_mass[:, self._payload_body] += payload
        factor = np.divide(
            body_mass, base.body_mass, out=np.ones_like(body_mass), where=base.body_mass > 0
        )
        b.expand("body_mass")[:] = body_mass
        b.expand("body_inertia")[:] = base.body_inertia * factor[:, :, None]
        if base.body_gravcomp.any():
            b.expand("body_gravcomp")[:] = base.body_gravcomp / factor
        b.expand("dof_damping")[:] = base.dof_damping * damping
        b.expand("dof_frictionloss")[:] = base.dof_frictionloss * friction
        kp = base.actuator_gainprm[:, 0] * gain
        b.expand("actuator_gainprm")[:, :, 0] = kp
        b.expand("actuator_biasprm")[:, :, 1] = -kp
        b.expand("geom_friction")[:, :, 0] = base.geom_friction[:, 0] * contact[:, None]
        b.set_const()

    def _renderer_of_size(self, width: int, height: int) -> mujoco.Renderer:
        """The renderer for ``width`` x ``height`` images, created (or re-created) here."""
        import mujoco

        renderer = self._renderer
        if renderer is not None and (renderer.width, renderer.height) == (width, height):
            return renderer
        self.close()
        if width < 1 or height < 1:
            raise ValueError(f"image size must be positive, got {width} x {height}")
        if MujocoBatchedEnv._offscreen_failure is not None:
            raise RuntimeError(MujocoBatchedEnv._offscreen_failure)
        try:
            renderer = mujoco.Renderer(self._model, height=height, width=width)
        except mujoco.FatalError as exc:
            MujocoBatchedEnv._offscreen_failure = (
                f"offscreen rendering failed ({exc}); set MUJOCO_GL=egl (or osmesa) before "
                "mujoco is imported"
            )
            raise RuntimeError(MujocoBatchedEnv._offscreen_failure) from exc
        renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
        renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
        self._renderer = renderer
        return renderer
