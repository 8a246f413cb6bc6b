"""locomotion-v0 on Isaac Lab 3 in its kit-less Newton mode: the MuJoCo-Warp solver, on the CPU
or a CUDA GPU.

The quadruped is ``sim_scenes/locomotion/quadruped.usda``, written from ``quadruped.xml`` by
:func:`write_quadruped_usd`: a free-floating torso as the articulation root, every body with
the compiled MJCF's mass, centre of mass and principal inertia, the hinges as revolute joints
with the same axes, frames and limits, and the geoms that touch the floor (torso box, feet) as
colliders with the MJCF's friction and contact stiffness. Self-collision is off, as the MJCF's
``contype``/``conaffinity`` masks have it. The floor is not part of the robot: every scene gets
a static collision plane at z = 0, shared by all worlds (:func:`spawn_floor`).

One control step is one Isaac Lab step of :data:`~stages.sim.locomotion.FRAME_SKIP` solver
substeps of 0.005 s (50 Hz), so action semantics, observation layout, reward, fall and success
predicates, the command and the scripted trot are those of :mod:`stages.sim.locomotion`. Random
draws follow :class:`~stages.sim.locomotion.LocomotionEnv`'s order, so the same scene, world
count and seed give the same commands, initial poses, randomization and pushes on both.

Differences from the MuJoCo backend: an implicit drive's force limit also bounds its damping
term; the contact-friction factor scales the robot's colliders, which win over the floor's
friction by MuJoCo contact priority (MuJoCo's own backend scales both, and takes the larger);
there is no offscreen renderer.

Isaac Lab is imported inside functions: without it, building the environment raises
:class:`stages.errors.BackendUnavailableError`.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.sim import locomotion as loco
from stages.sim.batched import EpisodeWorlds, randomizes_model
from stages.sim.bodies import BodyLayout, mujoco_layout
from stages.sim.gait import trot_joint_targets
from stages.sim.isaaclab_backend import (
    WARP_CACHE_ENV,
    _import_isaaclab,
    _quat_xyzw_to_matrix,
    _write_geom,
    sim_device,
    write_revolute,
)

if TYPE_CHECKING:
    from stages.sim.scene import Scene

QUADRUPED_USD = loco.QUADRUPED_XML.with_name("quadruped.usda")
"""The USD of the quadruped, written from ``quadruped.xml`` by :func:`write_quadruped_usd`."""

CONTACT_PRIORITY = 1
"""MuJoCo contact priority of the robot's colliders: their (randomized) friction is the one a
foot-floor contact uses, whatever the floor's."""

SOLVER_ITERATIONS = 100
"""Newton-solver iterations per substep (MuJoCo's default)."""

SOLVER_TOLERANCE = 1e-8
"""Solver convergence tolerance (MuJoCo's default)."""

MAX_CONTACTS = 16
"""Contact capacity per world: four feet and up to eight torso-box corners on the floor."""

MAX_CONSTRAINT_ROWS = 4 * MAX_CONTACTS + 2 * loco.NUM_JOINTS + 8
"""Constraint-row capacity per world: pyramidal contacts (four rows each, condim 3), joint
dry friction and limits, and slack."""

_ROBOT = "robot"
_FLOOR = "floor"
_USD_ROOT = "/quadruped"
_AXES = ("X", "Y", "Z")
_TORSO = "torso"


def write_quadruped_usd(mjcf: Path, out: Path) -> None:
    """Write the USD articulation of the MJCF quadruped ``mjcf`` to ``out`` (needs ``pxr``).

    Every body becomes a rigid body at its standing-pose frame with the MJCF's mass, centre of
    mass and principal inertia; the free joint is left out, so the torso floats as the
    articulation root; every hinge becomes a revolute joint with its axis, frames, limits
    (degrees) and a force drive whose gains are the position actuator's. Geoms that take part
    in contacts get a collision API, a physics material with the MJCF's sliding friction, its
    contact ``condim`` and ``solref``, and priority :data:`CONTACT_PRIORITY`.
    """
    import mujoco
    from pxr import Sdf, Usd, UsdGeom, UsdPhysics

    model = mujoco.MjModel.from_xml_path(str(mjcf))
    data = mujoco.MjData(model)
    stand = model.key("stand")
    data.qpos[:] = stand.qpos
    mujoco.mj_kinematics(model, data)

    stage = Usd.Stage.CreateNew(str(out))
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    UsdPhysics.SetStageKilogramsPerUnit(stage, 1.0)
    root = UsdGeom.Xform.Define(stage, _USD_ROOT)
    stage.SetDefaultPrim(root.GetPrim())
    UsdPhysics.ArticulationRootAPI.Apply(root.GetPrim())
    root.GetPrim().CreateAttribute(
        "physxArticulation:enabledSelfCollisions", Sdf.ValueTypeNames.Bool
    ).Set(False)

    writer = _QuadrupedUsd(stage, model)
    body_path = {body: writer.body(body, data) for body in range(1, model.nbody)}
    for joint in range(model.njnt):
        kind = model.jnt_type[joint]
        if kind == mujoco.mjtJoint.mjJNT_FREE:
            if model.jnt_bodyid[joint] != model.body(_TORSO).id:
                raise ValueError(f"{mjcf}: only the torso may float")
            continue
        if kind != mujoco.mjtJoint.mjJNT_HINGE:
            raise ValueError(f"{mjcf}: joint {model.joint(joint).name!r} is not a hinge")
        write_revolute(stage, model, joint, body_path, mjcf, _USD_ROOT)
    stage.GetRootLayer().Save()


class _QuadrupedUsd:
    """Writes the quadruped's bodies, shapes and contact materials into a USD stage."""

    def __init__(self, stage: Any, model: Any) -> None:
        self.stage, self.model = stage, model
        self.materials: dict[tuple[float, ...], Any] = {}

    @staticmethod
    def quat(wxyz: np.ndarray) -> Any:
        from pxr import Gf

        return Gf.Quatf(float(wxyz[0]), Gf.Vec3f(*(float(v) for v in wxyz[1:])))

    @staticmethod
    def vec(xyz: np.ndarray) -> Any:
        from pxr import Gf

        return Gf.Vec3f(*(float(v) for v in xyz))

    def place(self, xform: Any, pos: np.ndarray, wxyz: np.ndarray) -> None:
        from pxr import Gf

        xform.AddTranslateOp().Set(Gf.Vec3d(*(float(v) for v in pos)))
        xform.AddOrientOp().Set(self.quat(wxyz))

    def material(self, geom: int) -> Any:
        """The physics material of a contact geom's friction and solref, one per distinct
        pair."""
        from pxr import Sdf, UsdPhysics, UsdShade

        friction = tuple(float(v) for v in self.model.geom_friction[geom])
        solref = tuple(float(v) for v in self.model.geom_solref[geom])
        key = (*friction, *solref)
        if key not in self.materials:
            mat = UsdShade.Material.Define(
                self.stage, f"{_USD_ROOT}/materials/contact_{len(self.materials)}")
            api = UsdPhysics.MaterialAPI.Apply(mat.GetPrim())
            api.CreateStaticFrictionAttr(friction[0])
            api.CreateDynamicFrictionAttr(friction[0])
            api.CreateRestitutionAttr(0.0)
            prim = mat.GetPrim()
            prim.CreateAttribute("mjc:torsionalfriction", Sdf.ValueTypeNames.Float).Set(friction[1])
            prim.CreateAttribute("mjc:rollingfriction", Sdf.ValueTypeNames.Float).Set(friction[2])
            self.materials[key] = mat
        return self.materials[key]

    def body(self, body: int, data: Any) -> str:
        """Write rigid body ``body`` at its frame in ``data``, with its mass, inertia and
        shapes; returns its prim path."""
        from pxr import Gf, Sdf, UsdGeom, UsdPhysics, UsdShade

        model, stage = self.model, self.stage
        path = f"{_USD_ROOT}/{model.body(body).name}"
        xform = UsdGeom.Xform.Define(stage, path)
        self.place(xform, data.xpos[body], data.xquat[body])
        UsdPhysics.RigidBodyAPI.Apply(xform.GetPrim())
        mass = UsdPhysics.MassAPI.Apply(xform.GetPrim())
        mass.CreateMassAttr(float(model.body_mass[body]))
        mass.CreateCenterOfMassAttr(self.vec(model.body_ipos[body]))
        mass.CreateDiagonalInertiaAttr(self.vec(model.body_inertia[body]))
        mass.CreatePrincipalAxesAttr(self.quat(model.body_iquat[body]))
        for geom in np.flatnonzero(model.geom_bodyid == body):
            geom_path = f"{path}/{model.geom(geom).name}"
            _write_shape(stage, model, int(geom), geom_path, self.place)
            if model.geom_contype[geom] or model.geom_conaffinity[geom]:
                prim = stage.GetPrimAtPath(geom_path)
                binding = UsdShade.MaterialBindingAPI.Apply(prim)
                binding.Bind(self.material(int(geom)), UsdShade.Tokens.weakerThanDescendants,
                             "physics")
                prim.CreateAttribute("mjc:condim", Sdf.ValueTypeNames.Int).Set(
                    int(model.geom_condim[geom])
                )
                prim.CreateAttribute("mjc:solref", Sdf.ValueTypeNames.Float2).Set(
                    Gf.Vec2f(*(float(v) for v in model.geom_solref[geom]))
                )
                prim.CreateAttribute("mjc:priority", Sdf.ValueTypeNames.Int).Set(CONTACT_PRIORITY)
        return path


def _write_shape(stage: Any, model: Any, geom: int, path: str, place: Any) -> None:
    """Write MJCF geom ``geom`` as a USD gprim at ``path``: spheres here, the rest as the reach
    arm's writer does (with a collision API where the geom takes part in contacts)."""
    import mujoco
    from pxr import Gf, UsdGeom, UsdPhysics

    if model.geom_type[geom] != mujoco.mjtGeom.mjGEOM_SPHERE:
        _write_geom(stage, model, geom, path, place)
        return
    prim = UsdGeom.Sphere.Define(stage, path)
    place(prim, model.geom_pos[geom], model.geom_quat[geom])
    prim.CreateRadiusAttr(float(model.geom_size[geom][0]))
    prim.CreateDisplayColorAttr([Gf.Vec3f(*(float(c) for c in model.geom_rgba[geom][:3]))])
    if model.geom_contype[geom] or model.geom_conaffinity[geom]:
        UsdPhysics.CollisionAPI.Apply(prim.GetPrim())


def spawn_floor(
    prim_path: str,
    cfg: Any,
    translation: tuple[float, float, float] | None = None,
    orientation: tuple[float, float, float, float] | None = None,
    **kwargs: Any,
) -> Any:
    """Isaac Lab spawner of the floor: a static collision plane at z = 0, normal +z, with the
    MJCF floor's friction (1.0) and contact solref, shared by every world.

    ``cfg``, ``translation``, ``orientation`` and ``kwargs`` are the spawner signature's; the
    plane is always at the origin.
    """
    import isaaclab.sim as sim_utils
    from pxr import Gf, Sdf, UsdGeom, UsdPhysics, UsdShade

    stage = sim_utils.get_current_stage()
    root = UsdGeom.Xform.Define(stage, prim_path)
    plane = UsdGeom.Plane.Define(stage, f"{prim_path}/plane")
    plane.CreateAxisAttr("Z")
    plane.CreateWidthAttr(100.0)
    plane.CreateLengthAttr(100.0)
    UsdPhysics.CollisionAPI.Apply(plane.GetPrim())
    mat = UsdShade.Material.Define(stage, f"{prim_path}/material")
    api = UsdPhysics.MaterialAPI.Apply(mat.GetPrim())
    api.CreateStaticFrictionAttr(1.0)
    api.CreateDynamicFrictionAttr(1.0)
    api.CreateRestitutionAttr(0.0)
    UsdShade.MaterialBindingAPI.Apply(plane.GetPrim()).Bind(
        mat, UsdShade.Tokens.weakerThanDescendants, "physics"
    )
    plane.GetPrim().CreateAttribute("mjc:solref", Sdf.ValueTypeNames.Float2).Set(
        Gf.Vec2f(0.02, 1.0)
    )
    return root.GetPrim()


class _QuadrupedParams:
    """Nominal joint and body parameters of the quadruped, read from the MJCF (SI units)."""

    def __init__(self) -> None:
        """Compile ``quadruped.xml`` and copy what the Isaac Lab scene and the task need."""
        import mujoco

        model = mujoco.MjModel.from_xml_path(str(loco.QUADRUPED_XML))
        names = tuple(model.actuator(i).name for i in range(model.nu))
        if names != loco.JOINTS or model.nq != 7 + loco.NUM_JOINTS:
            raise ValueError(
                f"{loco.QUADRUPED_XML}: expected a free base and actuators {loco.JOINTS}"
            )
        joints = [model.joint(name).id for name in loco.JOINTS]
        dofs = model.jnt_dofadr[joints]
        self.kp = model.actuator_gainprm[:, 0].copy()
        self.kv = -model.actuator_biasprm[:, 2].copy()
        self.force_limit = model.actuator_forcerange[:, 1].copy()
        self.ctrl_low = model.actuator_ctrlrange[:, 0].copy()
        self.ctrl_high = model.actuator_ctrlrange[:, 1].copy()
        self.armature = model.dof_armature[dofs].copy()
        self.damping = model.dof_damping[dofs].copy()
        self.frictionloss = model.dof_frictionloss[dofs].copy()
        stand = model.key("stand")
        self.stand_qpos = stand.qpos.copy()
        self.default = stand.ctrl.copy()
        self.hips = np.array([model.body(f"{leg}_hip").pos for leg in loco.LEGS])
        self.body_names = tuple(model.body(b).name for b in range(1, model.nbody))
        self.body_mass = model.body_mass[1:].copy()
        self.links = np.flatnonzero(model.body_dofnum[1:] > 0)
        """Bodies (index into body_names) whose mass the scene's mass scale draws, in order."""
        self.torso = self.body_names.index(_TORSO)
        self.shanks = np.array([self.body_names.index(f"{leg}_shank") for leg in loco.LEGS])
        self.foot_offset = np.array(
            [model.geom_pos[model.geom(f"{leg}_foot").id] for leg in loco.LEGS]
        )
        self.num_dofs = model.nv
        self.layout = mujoco_layout(model)
        """The MJCF's bodies and shapes, which the USD articulation was written from."""


def _robot_order(robot: Any, mjcf_bodies: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Isaac Lab's index of each joint in the task's order, and of each MJCF body (without
    the world body); refuses an articulation whose joints or bodies are not the MJCF's."""
    joint_names = tuple(robot.joint_names)
    body_names = tuple(robot.body_names)
    if sorted(joint_names) != sorted(loco.JOINTS):
        raise ValueError(f"{QUADRUPED_USD}: joints {joint_names} != the MJCF's")
    if sorted(body_names) != sorted(mjcf_bodies):
        raise ValueError(f"{QUADRUPED_USD}: bodies {body_names} != the MJCF's")
    return (np.array([joint_names.index(j) for j in loco.JOINTS]),
            np.array([body_names.index(b) for b in mjcf_bodies]))


class IsaacLabLocomotionEnv(EpisodeWorlds):
    """N worlds of locomotion-v0 on Isaac Lab (Newton, MuJoCo-Warp solver, CPU or CUDA).

    Implements :class:`stages.sim.batched.BatchedEnv`, plus ``fallen()`` and ``respawn()`` for
    PPO's per-world episodes. Only one environment may live in a process at a time (Isaac Lab's
    simulation context is a singleton): :meth:`close` it before building the next.
    """

    def __init__(
        self,
        scene: Scene,
        num_worlds: int,
        seed: int,
        *,
        num_threads: int | None = None,
        device: str = "auto",
    ) -> None:
        """Build ``num_worlds`` worlds of ``scene`` on ``device`` (:func:`sim_device`); call
        reset() next.

        ``num_threads`` is accepted for the factory signature; Warp's CPU kernels run on one
        thread.
        """
        if scene.config.task != loco.TASK_NAME:
            raise ValueError(
                f"{loco.TASK_NAME} cannot run scene {scene.path} of task {scene.config.task!r}"
            )
        if num_worlds < 1:
            raise ValueError(f"num_worlds must be >= 1, got {num_worlds}")
        rand = scene.config.randomization
        cache = os.environ.get(WARP_CACHE_ENV)
        il = _import_isaaclab()
        if cache:
            import warp

            warp.config.kernel_cache_dir = cache
        self._il = il
        self._torch = il["torch"]
        self._device = sim_device(device)
        self._p = _QuadrupedParams()
        self._rand = rand
        self._num_worlds = num_worlds
        self._episode_steps = scene.config.episode_steps
        self._control_dt = 1.0 / loco.CONTROL_HZ
        self._rng = np.random.default_rng(seed)
        self._randomizes_model = randomizes_model(rand)

        il["SimulationContext"].clear_instance()
        self._sim = il["SimulationContext"](self._sim_cfg())
        self._scene = il["InteractiveScene"](self._scene_cfg(num_worlds))
        self._sim.reset()
        self._robot = self._scene[_ROBOT]
        self._joint_order, self._body_order = _robot_order(self._robot, self._p.body_names)
        self._to_isaac = np.argsort(self._joint_order)
        self._origins = self._scene.env_origins.cpu().numpy().astype(np.float64)
        self._nominal_inertia = self._robot.data.body_inertia.torch.cpu().numpy()
        self._nominal_mu = self._friction_tensor().cpu().numpy().copy()
        """Sliding friction of the robot's shapes as the USD sets it. Shape: (N, shapes)."""

        n = num_worlds
        self._kp = np.tile(self._p.kp, (n, 1))
        self._ctrl = np.tile(self._p.default, (n, 1))
        self._command = np.zeros((n, 3))
        self._last_action = np.zeros((n, loco.NUM_JOINTS))
        self._prev_action = np.zeros((n, loco.NUM_JOINTS))
        self._prev_xy = np.zeros((n, 2))
        self._fallen = np.zeros(n, dtype=bool)
        self._fell_now = np.zeros(n, dtype=bool)
        self._speed_error_sum = np.zeros(n)
        self._speed_samples = 0
        self._clock = np.zeros(n)
        self._pending: deque[np.ndarray] = deque()
        self._next_push = np.zeros(n, dtype=np.int64)
        self._steps_done = -1
        self._read_state()

    @property
    def obs_dim(self) -> int:
        """Length of one observation vector (50)."""
        return len(loco.OBS_NAMES)

    @property
    def act_dim(self) -> int:
        """Length of one action vector (12)."""
        return loco.NUM_JOINTS

    @property
    def command(self) -> np.ndarray:
        """This episode's command: vx (m/s), vy (m/s), yaw rate (rad/s). Shape: (N, 3)."""
        return self._command.copy()

    def reset(self) -> np.ndarray:
        """Draw randomization, commands and standing poses per world; start a new episode.

        Returns:
            Observations. Shape: (num_worlds, 50), float32.
        """
        if self._randomizes_model:
            self._randomize_model()
        n, rand, rng = self._num_worlds, self._rand, self._rng
        self._command = rng.uniform(rand.target_low, rand.target_high, size=(n, 3))
        noise = rng.uniform(
            -loco.INIT_JOINT_NOISE, loco.INIT_JOINT_NOISE, size=(n, loco.NUM_JOINTS)
        )
        self._place(np.arange(n), np.zeros((n, 2)), noise)
        self._last_action = np.zeros((n, loco.NUM_JOINTS))
        self._prev_action = np.zeros((n, loco.NUM_JOINTS))
        self._fallen = np.zeros(n, dtype=bool)
        self._fell_now = np.zeros(n, dtype=bool)
        self._speed_error_sum = np.zeros(n)
        self._speed_samples = 0
        self._clock = np.zeros(n)
        self._settle()
        self._prev_xy = self._base_pos[:, :2].copy()
        self._pending = deque(
            np.zeros((n, loco.NUM_JOINTS)) for _ in range(rand.action_delay_steps)
        )
        if rand.push_interval_steps is not None:
            low, high = rand.push_interval_steps
            self._next_push = rng.integers(low, high + 1, size=n)
        self._steps_done = 0
        return self._observe()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Set every servo target to the standing pose plus ACTION_SCALE * action and advance
        one control step (four 0.005 s substeps).

        Args:
            actions: Normalized actions, clipped to [-1, 1]. Shape: (num_worlds, 12).

        Returns:
            ``(obs, reward, done)``: shape (num_worlds, 50) float32, (num_worlds,) float32 and
            (num_worlds,) bool, True for every world at the last step of the episode.
        """
        actions = self._checked_actions(actions)
        chosen = np.clip(actions, -1.0, 1.0)
        applied = chosen
        if self._pending:
            self._pending.append(chosen)
            applied = self._pending.popleft()
        self._prev_action = self._last_action
        self._last_action = chosen
        self._prev_xy = self._base_pos[:, :2].copy()
        p = self._p
        self._ctrl = np.clip(p.default + loco.ACTION_SCALE * applied, p.ctrl_low, p.ctrl_high)
        self._set_position_targets()
        if self._rand.push_interval_steps is not None:
            self._push()
        self._scene.write_data_to_sim()
        self._sim.step(render=False)
        self._scene.update(self._control_dt)
        self._steps_done += 1
        self._read_state()
        self._after_step()
        reward = self._reward().astype(np.float32)
        done = np.full(self._num_worlds, self._steps_done >= self._episode_steps)
        return self._observe(), reward, done

    def success(self) -> np.ndarray:
        """No fall so far, and the mean absolute forward-speed error over the episode's second
        half so far is below 0.15 m/s (False until the second half has begun).

        Returns:
            Shape: (num_worlds,), bool.
        """
        return ~self._fallen & (self.forward_speed_error() < loco.SUCCESS_SPEED_ERROR)

    def forward_speed_error(self) -> np.ndarray:
        """Mean absolute forward-speed error (m/s) over the second half so far; NaN before.

        Returns:
            Shape: (num_worlds,), float64.
        """
        self._require_episode()
        if self._speed_samples == 0:
            return np.full(self._num_worlds, np.nan)
        return self._speed_error_sum / self._speed_samples

    def fallen(self) -> np.ndarray:
        """Whether each robot has fallen in this episode. Shape: (num_worlds,), bool."""
        self._require_episode()
        return self._fallen.copy()

    def respawn(self, worlds: np.ndarray) -> np.ndarray:
        """Restart some worlds mid-episode where they stand, as LocomotionEnv.respawn does.

        Args:
            worlds: Indices of the worlds to restart, each in [0, num_worlds).

        Returns:
            Observations of every world. Shape: (num_worlds, 50), float32.
        """
        idx = self._world_indices(worlds)
        if idx.size:
            rand, rng, k = self._rand, self._rng, idx.size
            self._command[idx] = rng.uniform(rand.target_low, rand.target_high, size=(k, 3))
            noise = rng.uniform(
                -loco.INIT_JOINT_NOISE, loco.INIT_JOINT_NOISE, size=(k, loco.NUM_JOINTS)
            )
            self._place(idx, self._base_pos[idx, :2], noise)
            self._last_action[idx] = 0.0
            self._prev_action[idx] = 0.0
            self._fallen[idx] = False
            self._fell_now[idx] = False
            self._clock[idx] = 0.0
            for pending in self._pending:
                pending[idx] = 0.0
            self._settle()
            self._prev_xy[idx] = self._base_pos[idx, :2]
        return self._observe()

    def expert_action(self) -> np.ndarray:
        """The scripted trot of :meth:`stages.sim.locomotion.LocomotionEnv.expert_action`.

        Returns:
            Actions in [-1, 1]. Shape: (num_worlds, 12), float32.
        """
        self._require_episode()
        targets = trot_joint_targets(
            loco.GAIT,
            (self._steps_done + 1) * self._control_dt,
            loco.TROT_OFFSETS,
            self._p.hips,
            self._command,
            self._velocity,
            -self._rot[:, 2, :],
            self._ang_vel,
        )
        action = (targets - self._p.default) / loco.ACTION_SCALE
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def trot_rhythm(self) -> np.ndarray:
        """How well the feet follow the gait clock's trot, in [0, 1] (see :mod:`locomotion`).

        Returns:
            Shape: (num_worlds,), float64.
        """
        self._require_episode()
        phases = np.mod(self._clock[:, None] / loco.GAIT.period + loco.TROT_OFFSETS, 1.0)
        swing = phases >= loco.GAIT.duty
        height = self._feet_height() - loco.FOOT_RADIUS
        lifted = np.clip(height / loco.FOOT_CLEARANCE, 0.0, 1.0)
        return np.asarray(np.where(swing, lifted, 1.0 - lifted).mean(axis=1))

    def clean_observation(self) -> np.ndarray:
        """The observation without the scene's sensor noise. Shape: (num_worlds, 50), float32."""
        self._require_episode()
        return self._clean_observation().astype(np.float32)

    def body_layout(self) -> BodyLayout:
        """The quadruped's bodies and shapes as its MJCF has them (the USD was written from it)."""
        return self._p.layout

    def body_poses(self, worlds: list[int]) -> np.ndarray:
        """Every MJCF body's pose in each of ``worlds``, in that world's frame: the world body
        (and its floor) at the origin, the robot's bodies as Isaac Lab has them.

        Returns:
            Position (m) and orientation (w, x, y, z). Shape: (len(worlds), bodies, 7).
        """
        self._require_episode()
        bad = [w for w in worlds if not 0 <= w < self._num_worlds]
        if bad:
            raise ValueError(f"worlds must be in [0, {self._num_worlds}), got {bad}")
        pos, xyzw = self._body_frames()
        idx = np.asarray(worlds, dtype=np.int64)
        poses = np.zeros((len(idx), len(self._p.layout.names), 7))
        poses[:, 0, 3] = 1.0
        poses[:, 1:, :3] = pos[idx]
        poses[:, 1:, 3] = xyzw[idx, :, 3]
        poses[:, 1:, 4:] = xyzw[idx, :, :3]
        return poses

    def render(self, worlds: Sequence[int], width: int, height: int, camera: str) -> np.ndarray:
        """Not available: the kit-less backend has no offscreen renderer here.

        Raises:
            NotImplementedError: Always; render rollouts on the MuJoCo backend.
        """
        raise NotImplementedError("the isaaclab backend does not render; use the mujoco backend")

    def close(self) -> None:
        """Tear down Isaac Lab's simulation context so another environment can be built."""
        self._il["SimulationContext"].clear_instance()

    def _sim_cfg(self) -> Any:
        """Simulation config: the device, gravity, MuJoCo-Warp implicitfast, FRAME_SKIP
        substeps."""
        il = self._il
        solver = il["MJWarpSolverCfg"](
            integrator="implicitfast",
            cone="pyramidal",
            njmax=MAX_CONSTRAINT_ROWS,
            nconmax=MAX_CONTACTS,
            iterations=SOLVER_ITERATIONS,
            tolerance=SOLVER_TOLERANCE,
        )
        physics = il["NewtonCfg"](
            solver_cfg=solver, num_substeps=loco.FRAME_SKIP, use_cuda_graph=False
        )
        return il["SimulationCfg"](
            dt=self._control_dt,
            device=self._device,
            gravity=(0.0, 0.0, -9.81),
            physics=physics,
            save_logs_to_file=False,
        )

    def _scene_cfg(self, num_worlds: int) -> Any:
        """Scene config: the floor, and the USD quadruped cloned into ``num_worlds`` worlds."""
        from isaaclab.assets import AssetBaseCfg

        il, p = self._il, self._p
        actuators = {
            name: il["ImplicitActuatorCfg"](
                joint_names_expr=[name],
                stiffness=float(p.kp[j]),
                damping=float(p.kv[j]),
                joint_effort_limit=float(p.force_limit[j]),
                armature=float(p.armature[j]),
                friction=float(p.frictionloss[j]),
                viscous_friction=float(p.damping[j]),
            )
            for j, name in enumerate(loco.JOINTS)
        }
        stand = p.stand_qpos
        robot = il["ArticulationCfg"](
            prim_path="{ENV_REGEX_NS}/Robot",
            spawn=il["sim_utils"].UsdFileCfg(usd_path=str(QUADRUPED_USD)),
            init_state=il["ArticulationCfg"].InitialStateCfg(
                pos=tuple(float(v) for v in stand[0:3]),
                rot=(float(stand[4]), float(stand[5]), float(stand[6]), float(stand[3])),
                joint_pos={n: float(q) for n, q in zip(loco.JOINTS, p.default, strict=True)},
            ),
            actuators=actuators,
            soft_joint_pos_limit_factor=1.0,
        )
        floor = AssetBaseCfg(
            prim_path=f"/World/{_FLOOR}",
            spawn=il["sim_utils"].SpawnerCfg(func=spawn_floor),
            collision_group=-1,
        )
        scene_cfg_type = il["configclass"](
            type(
                "LocomotionSceneCfg",
                (il["InteractiveSceneCfg"],),
                {
                    "__annotations__": {_FLOOR: AssetBaseCfg, _ROBOT: il["ArticulationCfg"]},
                    _FLOOR: floor,
                    _ROBOT: robot,
                },
            )
        )
        return scene_cfg_type(num_envs=num_worlds, env_spacing=2.0)

    def _friction_tensor(self) -> Any:
        """Newton's per-world sliding friction of the robot's shapes (a writable torch view)."""
        import warp

        model = self._sim.physics_manager.get_model()
        binding = self._robot._root_view.get_attribute("shape_material_mu", model)[:, 0]
        return warp.to_torch(binding)

    def _randomize_model(self) -> None:
        """Draw per-world masses, payload, damping, friction, gains and contact friction and
        write them to Newton, in LocomotionEnv's order and sizes."""
        n, p, rand, rng = self._num_worlds, self._p, self._rand, self._rng
        nj = loco.NUM_JOINTS
        mass = rng.uniform(*rand.mass_scale, size=(n, p.links.size))
        payload = rng.uniform(*rand.payload_mass, size=n)
        damping = rng.uniform(*rand.damping_scale, size=(n, p.num_dofs))[:, 6:]
        friction = rng.uniform(*rand.friction_scale, size=(n, p.num_dofs))[:, 6:]
        gain = rng.uniform(*rand.gain_scale, size=(n, nj))
        contact = rng.uniform(*rand.contact_friction_scale, size=n)

        scale = np.ones((n, len(p.body_names)))
        scale[:, p.links] = mass
        body_mass = p.body_mass * scale
        body_mass[:, p.torso] += payload
        factor = body_mass / p.body_mass
        robot, order = self._robot, self._body_order
        isaac_mass = np.zeros_like(body_mass)
        isaac_mass[:, order] = body_mass
        isaac_factor = np.ones_like(factor)
        isaac_factor[:, order] = factor
        robot.set_masses_index(masses=self._tensor(isaac_mass))
        robot.set_inertias_index(
            inertias=self._tensor(self._nominal_inertia * isaac_factor[:, :, None])
        )
        to_isaac = self._to_isaac
        robot.write_joint_viscous_friction_coefficient_to_sim_index(
            joint_viscous_friction_coeff=self._tensor((p.damping * damping)[:, to_isaac])
        )
        robot.write_joint_friction_coefficient_to_sim_index(
            joint_friction_coeff=self._tensor((p.frictionloss * friction)[:, to_isaac])
        )
        self._kp = p.kp * gain
        robot.write_joint_stiffness_to_sim_index(stiffness=self._tensor(self._kp[:, to_isaac]))
        mu = self._friction_tensor()
        mu[:] = self._torch.as_tensor(
            self._nominal_mu * contact[:, None], dtype=mu.dtype, device=mu.device
        )
        from newton import ModelFlags

        self._sim.physics_manager.add_model_change(ModelFlags.SHAPE_PROPERTIES)

    def _place(self, worlds: np.ndarray, xy: np.ndarray, noise: np.ndarray) -> None:
        """Stand ``worlds``' robots upright at ``xy`` (m, each world's frame), joints at the
        standing pose plus ``noise`` (rad, task order), still, servos holding the pose."""
        p, k = self._p, worlds.size
        pose = np.zeros((k, 7))
        pose[:, 0:2] = xy
        pose[:, 2] = p.stand_qpos[2]
        pose[:, :3] += self._origins[worlds]
        pose[:, 3:6] = p.stand_qpos[4:7]
        pose[:, 6] = p.stand_qpos[3]
        ids = self._torch.as_tensor(worlds, dtype=self._torch.long, device=self._device)
        robot = self._robot
        robot.write_root_pose_to_sim_index(root_pose=self._tensor(pose), env_ids=ids)
        robot.write_root_velocity_to_sim_index(
            root_velocity=self._tensor(np.zeros((k, 6))), env_ids=ids
        )
        qpos = (p.stand_qpos[7:] + noise)[:, self._to_isaac]
        robot.write_joint_position_to_sim_index(position=self._tensor(qpos), env_ids=ids)
        robot.write_joint_velocity_to_sim_index(
            velocity=self._tensor(np.zeros_like(qpos)), env_ids=ids
        )
        self._ctrl[worlds] = p.default
        self._set_position_targets()

    def _settle(self) -> None:
        """Write the placed state to the simulator and recompute the kinematics (no step)."""
        self._scene.write_data_to_sim()
        self._sim.forward()
        self._scene.update(0.0)
        self._read_state()

    def _push(self) -> None:
        """Add a horizontal velocity of random direction and size to every torso due a push."""
        due = np.flatnonzero(self._next_push == self._steps_done)
        if not due.size:
            return
        rand, rng = self._rand, self._rng
        speed = rng.uniform(*rand.push_velocity, size=due.size)
        heading = rng.uniform(0.0, 2.0 * np.pi, size=due.size)
        vel = self._robot.data.root_link_vel_w.torch.cpu().numpy().astype(np.float64)[due]
        vel[:, 0] += speed * np.cos(heading)
        vel[:, 1] += speed * np.sin(heading)
        ids = self._torch.as_tensor(due, dtype=self._torch.long, device=self._device)
        self._robot.write_root_link_velocity_to_sim_index(
            root_velocity=self._tensor(vel), env_ids=ids
        )
        if rand.push_interval_steps is not None:
            low, high = rand.push_interval_steps
            self._next_push[due] += rng.integers(low, high + 1, size=due.size)

    def _tensor(self, array: np.ndarray) -> Any:
        """``array`` as a float32 torch tensor on the simulation device."""
        return self._torch.as_tensor(
            np.ascontiguousarray(array), dtype=self._torch.float32, device=self._device
        )

    def _set_position_targets(self) -> None:
        """Send the servo targets (rad, task order). Shape of the targets: (N, 12)."""
        self._robot.actuators.target_command.set_position_index(
            value=self._tensor(self._ctrl[:, self._to_isaac])
        )

    def _read_state(self) -> None:
        """Torso pose and velocities (torso frame) and joint state from Isaac Lab."""
        data = self._robot.data

        def read(array: Any) -> np.ndarray:
            return array.torch.cpu().numpy().astype(np.float64)

        self._base_pos = read(data.root_link_pos_w) - self._origins
        self._rot = _quat_xyzw_to_matrix(read(data.root_link_quat_w))
        self._velocity = read(data.root_link_lin_vel_b)
        self._ang_vel = read(data.root_link_ang_vel_b)
        self._qpos = read(data.joint_pos)[:, self._joint_order]
        self._qvel = read(data.joint_vel)[:, self._joint_order]

    def _body_frames(self) -> tuple[np.ndarray, np.ndarray]:
        """Body origins (m, each world's frame) and orientations (x, y, z, w), MJCF order.

        Returns:
            Shapes (N, B, 3) and (N, B, 4).
        """
        data = self._robot.data
        pos = data.body_link_pos_w.torch.cpu().numpy().astype(np.float64)[:, self._body_order]
        xyzw = data.body_link_quat_w.torch.cpu().numpy().astype(np.float64)[:, self._body_order]
        return pos - self._origins[:, None, :], xyzw

    def _feet_height(self) -> np.ndarray:
        """Height (m) of each foot centre over the floor. Shape: (N, 4)."""
        pos, xyzw = self._body_frames()
        shanks = self._p.shanks
        rot = _quat_xyzw_to_matrix(xyzw[:, shanks])
        feet = pos[:, shanks] + np.einsum("nlij,lj->nli", rot, self._p.foot_offset)
        return feet[:, :, 2]

    def _after_step(self) -> None:
        """Record falls and, in the episode's second half, the forward-speed error."""
        self._clock += self._control_dt
        rot = self._rot
        down = (self._base_pos[:, 2] < loco.FALL_HEIGHT) | (rot[:, 2, 2] < loco.FALL_TILT_COS)
        self._fell_now = down & ~self._fallen
        self._fallen |= down
        if 2 * self._steps_done > self._episode_steps:
            heading = np.arctan2(rot[:, 1, 0], rot[:, 0, 0])
            moved = self._base_pos[:, :2] - self._prev_xy
            speed = (moved[:, 0] * np.cos(heading) + moved[:, 1] * np.sin(heading)) / (
                self._control_dt
            )
            self._speed_error_sum += np.abs(speed - self._command[:, 0])
            self._speed_samples += 1

    def _reward(self) -> np.ndarray:
        """LocomotionEnv's reward: tracking and trot rhythm minus rate, power and fall penalties.

        The actuator torque of the power term is the position servo's, clipped to its limit.
        """
        p = self._p
        planar = np.sum((self._velocity[:, :2] - self._command[:, :2]) ** 2, axis=1)
        yaw = (self._ang_vel[:, 2] - self._command[:, 2]) ** 2
        torque = np.clip(
            self._kp * (self._ctrl - self._qpos) - p.kv * self._qvel, -p.force_limit, p.force_limit
        )
        power = np.abs(torque * self._qvel).sum(axis=1)
        rate = np.sum((self._last_action - self._prev_action) ** 2, axis=1)
        return (
            np.exp(-planar / loco.TRACKING_SIGMA2)
            + loco.YAW_WEIGHT * np.exp(-yaw / loco.TRACKING_SIGMA2)
            + loco.GAIT_WEIGHT * self.trot_rhythm()
            - loco.ACTION_RATE_WEIGHT * rate
            - loco.POWER_WEIGHT * power
            - loco.FALL_PENALTY * self._fell_now
        )

    def _clean_observation(self) -> np.ndarray:
        """Torso velocities, gravity, command, joints, last action, clock. Shape: (N, 50)."""
        phase = 2.0 * np.pi * self._clock / loco.GAIT.period
        return np.concatenate(
            [
                self._velocity,
                self._ang_vel,
                -self._rot[:, 2, :],
                self._command,
                self._qpos,
                self._qvel,
                self._last_action,
                np.sin(phase)[:, None],
                np.cos(phase)[:, None],
            ],
            axis=1,
        )

    def _observe(self) -> np.ndarray:
        """The observation of every world, noise included. Shape: (N, 50), float32."""
        obs = self._clean_observation()
        if self._rand.obs_noise_std > 0.0:
            obs = obs + self._rng.normal(0.0, self._rand.obs_noise_std, size=obs.shape)
        return obs.astype(np.float32)

