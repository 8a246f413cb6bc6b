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

Cameras render from a model copy that takes each world's look in turn: the task's own
(:meth:`MujocoBatchedEnv._paint`), then the scene's visual variation drawn for the episode over
it (light intensity and direction, geom colours, camera pose), so a scene's colour of a geom
wins over the task's; image noise is added to the frames a policy reads. The worlds' frames are
drawn into the tiles of one framebuffer and read back at once (:mod:`stages.sim.env.tiled`), in this
process or spread over worker processes, or one world at a time: the same images.
"""

from __future__ import annotations

import copy
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

import numpy as np

from stages.sim.env.batched import LookDraws, RobotEpisodes, default_num_threads, scaled_masses
from stages.sim.env.bodies import BodyLayout, mujoco_layout, mujoco_poses
from stages.sim.env.capabilities import EnvCapabilities

if TYPE_CHECKING:
    import mujoco
    from mujoco import batch as mjbatch

    from stages.sim.env.cameras import CameraSpec
    from stages.sim.env.tiled import TiledCameras
    from stages.sim.scenes.scene import Scene


_R = TypeVar("_R")
"""What an OpenGL renderer's factory makes (:meth:`MujocoBatchedEnv._offscreen`)."""

IMAGE_NOISE_STREAM = 1
"""Second seed word of the generator of image noise, ``default_rng((seed, 1))``: a stream of
its own, so rendering a camera or not never changes any other draw of the scene."""


def release_egl_thread() -> None:
    """Make no EGL context current on the calling thread and release the thread's EGL state,
    where ``MUJOCO_GL=egl`` and this process has rendered; otherwise do nothing."""
    import sys

    if os.environ.get("MUJOCO_GL", "").lower() != "egl" or "mujoco.egl" not in sys.modules:
        return
    egl = sys.modules["mujoco.egl"]
    if egl.EGL_DISPLAY is None:
        return
    if egl.EGL.eglGetCurrentContext():
        egl.EGL.eglMakeCurrent(egl.EGL_DISPLAY, egl.EGL.EGL_NO_SURFACE, egl.EGL.EGL_NO_SURFACE,
                               egl.EGL.EGL_NO_CONTEXT)
    egl.EGL.eglReleaseThread()


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


@dataclass(frozen=True)
class WorldLooks:
    """What the scene's visual variation writes into the rendering model, per world."""

    light_scale: np.ndarray | None
    """Factor on every light's and the headlight's colours. Shape: (N,)."""
    light_dir: np.ndarray | None
    """Every light's direction (unit vector, its body's frame). Shape: (N, lights, 3)."""
    geom_rgb: tuple[tuple[int, np.ndarray], ...]
    """Geom id and its colour per world (RGB, 0..1; shape (N, 3)), for each coloured geom."""
    camera_pos: np.ndarray | None
    """Position (m, body frame) of each of the task's cameras. Shape: (N, cameras, 3)."""
    camera_quat: np.ndarray | None
    """Orientation (w, x, y, z) of each of the task's cameras. Shape: (N, cameras, 4)."""


def tilted(directions: np.ndarray, tilt: np.ndarray) -> np.ndarray:
    """Unit ``directions`` (shape (L, 3)) tilted by ``tilt[..., 0]`` (rad) towards the side
    ``tilt[..., 1]`` (rad, about each direction). ``tilt``: shape (N, L, 2); returns (N, L, 3)."""
    d = directions / np.linalg.norm(directions, axis=-1, keepdims=True)
    helper = np.eye(3)[np.argmin(np.abs(d), axis=-1)]
    u = np.cross(d, helper)
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    v = np.cross(d, u)
    angle, side = tilt[..., 0:1], tilt[..., 1:2]
    return np.cos(angle) * d + np.sin(angle) * (np.cos(side) * u + np.sin(side) * v)


def rotated(quats: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """Orientations ``quats`` (w, x, y, z; shape (C, 4)) turned by ``rotation``, rotation
    vectors (rad) in each orientation's own frame. ``rotation``: (N, C, 3); returns (N, C, 4)."""
    angle = np.linalg.norm(rotation, axis=-1, keepdims=True)
    axis = np.divide(rotation, angle, out=np.zeros_like(rotation), where=angle > 0)
    dq = np.concatenate([np.cos(angle / 2), np.sin(angle / 2) * axis], axis=-1)
    w1, v1 = quats[..., :1], quats[..., 1:]
    w2, v2 = dq[..., :1], dq[..., 1:]
    return np.concatenate([w1 * w2 - np.sum(v1 * v2, axis=-1, keepdims=True),
                           w1 * v2 + w2 * v1 + np.cross(v1, v2)], axis=-1)


class MujocoBatchedEnv(RobotEpisodes, ABC):
    """Base of every MuJoCo task: the :class:`~stages.sim.env.batched.BatchedEnv` plumbing.

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

    def __init__(self, scene: Scene, num_worlds: int, seed: int, *, task_name: str,
                 model_path: Path, frame_skip: int, control_hz: float, payload_body: str,
                 step_stage: mujoco.mjtStage | None = None,
                 num_threads: int | None = None,
                 cameras: Sequence[CameraSpec] = ()) -> None:
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
            cameras: The task's cameras (:meth:`camera_images` renders them); each names a
                camera of the model.
        """
        import mujoco
        from mujoco import batch as mjbatch

        model, threads = _load_model(model_path, num_worlds, num_threads, frame_skip,
                                     control_hz)
        self._start_robot(scene, task_name, num_worlds, seed, control_hz)
        self._model = model
        self._frame_skip = frame_skip
        self._step_stage = mujoco.mjtStage.mjSTAGE_NONE if step_stage is None else step_stage

        self._batch = mjbatch.Batch(model, num_worlds, nthread=threads)
        self._qpos = self._batch.bind("qpos")
        self._qvel = self._batch.bind("qvel")
        self._ctrl = self._batch.bind("ctrl")

        self._links = np.flatnonzero(model.body_dofnum > 0)
        self._payload_body = model.body(payload_body).id
        free = np.flatnonzero(model.jnt_type == mujoco.mjtJoint.mjJNT_FREE)
        self._free_dof = int(model.jnt_dofadr[free[0]]) if free.size else -1
        if self._rand.push_interval_steps is not None and self._free_dof < 0:
            raise ValueError(f"{model_path}: pushes need a free-floating base")
        self._render_model: mujoco.MjModel | None = None
        self._render_data: mujoco.MjData | None = None
        self._renderer: mujoco.Renderer | None = None
        known = {model.camera(i).name for i in range(model.ncam)}
        unknown = [c.camera for c in cameras if c.camera not in known]
        if unknown:
            raise ValueError(f"{model_path}: no camera {', '.join(unknown)} in the model; it "
                             f"has {', '.join(sorted(known)) or 'none'}")
        self._cameras = tuple(cameras)
        self._camera_renderers: dict[tuple[int, int], mujoco.Renderer] = {}
        self._camera_ids = np.unique([model.camera(c.camera).id for c in cameras]).astype(int)
        self._geom_ids = self._coloured_geoms(scene, model_path)
        self._look: WorldLooks | None = None
        self._image_rng = np.random.default_rng((seed, IMAGE_NOISE_STREAM))

    def _coloured_geoms(self, scene: Scene, model_path: Path) -> dict[str, int]:
        """Id of every geom the scene colours; a name the model lacks is refused in one line."""
        import mujoco

        model = self._model
        ids = {name: mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, name)
               for name in self._rand.geom_colours}
        missing = [name for name, i in ids.items() if i < 0]
        if missing:
            raise ValueError(f"{scene.path}: randomization.geom_colours: no geom "
                             f"{', '.join(missing)} in {model_path.name}")
        return ids

    @property
    def cameras(self) -> tuple[CameraSpec, ...]:
        """The cameras the task observes through (:mod:`stages.sim.env.cameras`)."""
        return self._cameras

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

    def _begin_episode(self) -> None:
        """Draw this episode's model randomization (if the scene has any) and clear every
        world's state."""
        import mujoco

        if self._randomizes_model:
            self._randomize_model()
        else:
            self._drawn = {}
        self._batch.reset(stage=mujoco.mjtStage.mjSTAGE_NONE)

    def _begin_look(self) -> None:
        """Draw the episode's visual variation (if the scene sets any) and what it writes
        into each world's rendering model."""
        if not self._rand.looks():
            self._looked, self._look = {}, None
            return
        base, cams = self._model, self._camera_ids
        draws: LookDraws = self._draw_look(base.nlight, cams.size)
        self._look = WorldLooks(
            light_scale=draws.light_scale,
            light_dir=None if draws.light_tilt is None else tilted(base.light_dir,
                                                                   draws.light_tilt),
            geom_rgb=tuple((self._geom_ids[name], rgb) for name, rgb in draws.colours.items()),
            camera_pos=None if draws.camera_offset is None else (base.cam_pos[cams]
                                                                 + draws.camera_offset),
            camera_quat=None if draws.camera_rotation is None else rotated(
                base.cam_quat[cams], draws.camera_rotation))

    def _settle(self, worlds: np.ndarray | None) -> None:
        """Recompute the derived fields (``step_stage``) at the initial states written at
        reset; a restart of single worlds leaves that to the next step."""
        if worlds is None:
            self._batch.forward(stage=self._step_stage)

    @property
    def capabilities(self) -> EnvCapabilities:
        """As every robot's, and its cameras, tiled; its bodies; stepping off thread (the
        batch's step is one C call that releases the GIL, ``docs/validation.md``)."""
        cams = bool(self._cameras)
        return replace(super().capabilities, cameras=cams, tiled_cameras=cams,
                       body_layout=True, steps_off_thread=True)

    def _advance(self) -> None:
        """``frame_skip`` physics steps in every world, then the forward stages of
        ``step_stage`` at the new state."""
        self._batch.step(nstep=self._frame_skip, stage=self._step_stage)

    def _kick(self, worlds: np.ndarray, velocity: np.ndarray) -> None:
        """Add ``velocity`` (m/s, world x and y) to the free base of each of ``worlds``."""
        dof = self._free_dof
        self._qvel[worlds, dof] += velocity[:, 0]
        self._qvel[worlds, dof + 1] += velocity[:, 1]

    @abstractmethod
    def success(self) -> np.ndarray:
        """The task's success predicate. Shape: (num_worlds,), bool."""

    @abstractmethod
    def expert_action(self) -> np.ndarray:
        """The scripted expert's action for the true state. Shape: (num_worlds, act_dim)."""

    def render(self, worlds: Sequence[int], width: int, height: int, camera: str) -> np.ndarray:
        """Render the current state of some worlds offscreen, shadows and reflections off, each
        world with its look (as its cameras see it, without image noise).

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
        render_model, render_data = self._render_copy()
        frames = np.empty((len(worlds), height, width, 3), dtype=np.uint8)
        for k, world in enumerate(worlds):
            if self._randomizes_model:
                self._batch.get_model(world, render_model)
            self._paint(world, render_model)
            self._paint_scene(world, render_model)
            self._batch.get_data(world, render_data)
            mujoco.mj_forward(render_model, render_data)
            renderer.update_scene(render_data, camera=camera)
            renderer.render(out=frames[k])
        return frames

    camera_tiles: str | None = None
    """How the cameras render (:func:`stages.sim.env.tiled.tile_processes`: ``off``, ``on``,
    ``auto`` or a number of worker processes); None: ``auto``. Set by :meth:`tile_cameras`."""

    def tile_cameras(self, setting: str) -> None:
        """Render the cameras as ``setting`` says (:attr:`camera_tiles`)."""
        self.camera_tiles = setting

    _tiled: TiledCameras | None = None
    """The tiled renderer of the colour cameras, made on first use."""

    def camera_images(self) -> dict[str, np.ndarray]:
        """Every declared camera of every world at the current state, offscreen, shadows and
        reflections off (see :meth:`render` for the OpenGL backend it needs): each world with
        its look (:meth:`_paint`, then :meth:`_paint_scene`), the scene's image noise added to
        the colour images. Colour-only cameras are drawn in tiles (:mod:`stages.sim.env.tiled`)
        unless :attr:`camera_tiles` says ``off``; the images are the same either way.

        Returns:
            By tensor name: ``<camera>_image`` (N, height, width, 3) uint8 and
            ``<camera>_depth`` (N, height, width, 1) float32 (m).
        """
        self._require_episode()
        n = self._num_worlds
        out = {key: np.empty((n, *cam.shape(key)), dtype=cam.dtype(key))
               for cam in self._cameras for key in cam.tensors()}
        tiled = self._tiled_cameras()
        if tiled is not None:
            tiled.render(self._world_look, out)
        else:
            for world in range(n):
                _, data = self._world_look(world)
                for cam in self._cameras:
                    renderer = self._camera_renderer(cam.width, cam.height)
                    renderer.update_scene(data, camera=cam.camera)
                    if cam.rgb:
                        renderer.render(out=out[cam.image_key][world])
                    if cam.depth:
                        renderer.enable_depth_rendering()
                        out[cam.depth_key][world, :, :, 0] = renderer.render()
                        renderer.disable_depth_rendering()
        std = self._rand.image_noise_std
        for key in (cam.image_key for cam in self._cameras if cam.rgb and std):
            noise = self._image_rng.standard_normal(out[key].shape, dtype=np.float32) * std
            out[key] = np.clip(np.rint(out[key] + noise), 0, 255).astype(np.uint8)
        return out

    def _world_look(self, world: int) -> tuple[mujoco.MjModel, mujoco.MjData]:
        """The rendering copy painted with world ``world``'s look and its data filled with the
        world's state, kinematics and camera and light poses."""
        import mujoco

        model, data = self._render_copy()
        if self._randomizes_model:
            self._batch.get_model(world, model)
        self._paint(world, model)
        self._paint_scene(world, model)
        self._batch.get_data(world, data)
        mujoco.mj_kinematics(model, data)
        mujoco.mj_camlight(model, data)
        return model, data

    def _tiled_cameras(self) -> TiledCameras | None:
        """The tiled renderer as :attr:`camera_tiles` asks, (re)made here; None when cameras
        render one world at a time: ``off``, or a camera that gives depth."""
        from stages.sim.env.tiled import TiledCameras, tile_processes

        processes = tile_processes(self._num_worlds, self.camera_tiles or "auto")
        if processes < 0 or any(cam.depth for cam in self._cameras) or not self._cameras:
            return None
        if self._tiled is not None and self._tiled.processes != processes:
            self._tiled.close()
            self._tiled = None
        if self._tiled is None:
            self._tiled = self._offscreen(lambda: TiledCameras(
                self._render_copy()[0], self._cameras, self._num_worlds, processes))
        return self._tiled

    def _paint(self, world: int, model: mujoco.MjModel) -> None:
        """Set what world ``world`` of the task looks like (colours, lights, camera poses) in
        ``model``, the copy its cameras render from; the base changes nothing. The scene's
        visual variation (:meth:`_paint_scene`) goes over it. A look may change only the fields
        of :data:`stages.sim.env.tiled.LOOK_FIELDS` and the headlight's colours: what a tile
        worker process copies of each world."""

    def _paint_scene(self, world: int, model: mujoco.MjModel) -> None:
        """Write the scene's visual variation of world ``world`` into ``model``, over the
        task's look: every light's and the headlight's colours scaled, light directions
        tilted, geom colours (alpha kept) and the task's cameras moved; each value from the
        nominal model, so whatever the copy held before is overwritten."""
        look = self._look
        if look is None:
            return
        base = self._model
        if look.light_scale is not None:
            scale = look.light_scale[world]
            model.light_ambient[:] = base.light_ambient * scale
            model.light_diffuse[:] = base.light_diffuse * scale
            model.light_specular[:] = base.light_specular * scale
            head, nominal = model.vis.headlight, base.vis.headlight
            head.ambient[:] = nominal.ambient * scale
            head.diffuse[:] = nominal.diffuse * scale
            head.specular[:] = nominal.specular * scale
        if look.light_dir is not None:
            model.light_dir[:] = look.light_dir[world]
        for geom, rgb in look.geom_rgb:
            model.geom_rgba[geom, :3] = rgb[world]
        if look.camera_pos is not None:
            model.cam_pos[self._camera_ids] = look.camera_pos[world]
        if look.camera_quat is not None:
            model.cam_quat[self._camera_ids] = look.camera_quat[world]

    def _render_copy(self) -> tuple[mujoco.MjModel, mujoco.MjData]:
        """The model copy and data that one world at a time is rendered from."""
        import mujoco

        if self._render_model is None or self._render_data is None:
            self._render_model = copy.copy(self._model)
            self._render_data = mujoco.MjData(self._render_model)
        return self._render_model, self._render_data

    def _camera_renderer(self, width: int, height: int) -> mujoco.Renderer:
        """The renderer of the task's ``width`` x ``height`` cameras, made on first use."""
        renderer = self._camera_renderers.get((width, height))
        if renderer is None:
            renderer = self._new_renderer(width, height)
            self._camera_renderers[(width, height)] = renderer
        return renderer

    def body_layout(self) -> BodyLayout:
        """The model's bodies and visible geoms (see
        :class:`~stages.sim.env.bodies.RecordsBodies`)."""
        return mujoco_layout(self._model)

    def body_poses(self, worlds: list[int]) -> np.ndarray:
        """Every body's world pose in each of ``worlds``. Shape: (len(worlds), bodies, 7)."""
        self._require_episode()
        bad = [w for w in worlds if not 0 <= w < self._num_worlds]
        if bad:
            raise ValueError(f"worlds must be in [0, {self._num_worlds}), got {bad}")
        render_model, render_data = self._render_copy()
        poses = np.empty((len(worlds), self._model.nbody, 7), dtype=np.float64)
        for k, world in enumerate(worlds):
            self._batch.get_data(world, render_data)
            poses[k] = mujoco_poses(render_model, render_data)
        return poses

    def release_thread(self) -> None:
        """Leave no OpenGL context current on the calling thread, which is ending (a group of
        an overlapped rollout renders on a thread of its own, :mod:`stages.sim.env.overlap`):
        an EGL context current on an ended thread can be neither made current nor freed by
        another. OSMesa's and GLFW's contexts are not held by a thread."""
        release_egl_thread()

    def close(self) -> None:
        """Release the renderers' OpenGL contexts and tile workers, if any were created."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        for renderer in self._camera_renderers.values():
            renderer.close()
        self._camera_renderers.clear()
        if self._tiled is not None:
            self._tiled.close()
            self._tiled = None

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

    def _randomize_model(self) -> None:
        """Draw per-world model parameters and write them into the batch's per-world fields.

        Mass factors scale each moving body's mass and inertia; the payload is added to the
        payload body with its inertia scaled alike; gravity compensation keeps the nominal
        masses. Damping and friction factors are per degree of freedom, gain factors per
        actuator (stiffness kp and the matching bias term), and one contact-friction factor per
        world scales the sliding friction of every geom.
        """
        base, b = self._model, self._batch
        draws = self._draw_model(self._links.size, base.nv, base.nu)
        body_mass, factor = scaled_masses(base.body_mass, self._links, draws, self._payload_body)
        b.expand("body_mass")[:] = body_mass
        b.expand("body_inertia")[:] = base.body_inertia * factor[:, :, None]
        if base.body_gravcomp.any():
            b.expand("body_gravcomp")[:] = base.body_gravcomp / factor
        b.expand("dof_damping")[:] = base.dof_damping * draws.damping
        b.expand("dof_frictionloss")[:] = base.dof_frictionloss * draws.friction
        kp = base.actuator_gainprm[:, 0] * draws.gain
        b.expand("actuator_gainprm")[:, :, 0] = kp
        b.expand("actuator_biasprm")[:, :, 1] = -kp
        b.expand("geom_friction")[:, :, 0] = base.geom_friction[:, 0] * draws.contact[:, None]
        b.set_const()

    def _renderer_of_size(self, width: int, height: int) -> mujoco.Renderer:
        """The renderer for ``width`` x ``height`` images, created (or re-created) here."""
        renderer = self._renderer
        if renderer is not None and (renderer.width, renderer.height) == (width, height):
            return renderer
        if renderer is not None:
            renderer.close()
            self._renderer = None
        self._renderer = self._new_renderer(width, height)
        return self._renderer

    def _offscreen(self, make: Callable[[], _R]) -> _R:
        """``make()``, which creates an OpenGL context; after a first failure in this process
        none is tried again, and the failure names the ``MUJOCO_GL`` backends that work."""
        import mujoco

        if MujocoBatchedEnv._offscreen_failure is not None:
            raise RuntimeError(MujocoBatchedEnv._offscreen_failure)
        try:
            return make()
        except mujoco.FatalError as exc:
            MujocoBatchedEnv._offscreen_failure = (
                f"offscreen rendering failed ({exc}); set MUJOCO_GL=egl (or osmesa) before "
                "mujoco is imported"
            )
            raise RuntimeError(MujocoBatchedEnv._offscreen_failure) from exc

    def _new_renderer(self, width: int, height: int) -> mujoco.Renderer:
        """A renderer of ``width`` x ``height`` images with shadows and reflections off."""
        import mujoco

        if width < 1 or height < 1:
            raise ValueError(f"image size must be positive, got {width} x {height}")
        renderer = self._offscreen(lambda: mujoco.Renderer(self._render_copy()[0],
                                                           height=height, width=width))
        renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
        renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
        return renderer
