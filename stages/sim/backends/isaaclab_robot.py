"""The Isaac Lab backend of the robot tasks (:class:`IsaacLabRobot`), and reach-v0 on it: Isaac
Lab 3 in its kit-less Newton mode, the MuJoCo-Warp solver on the CPU or a CUDA GPU.

:class:`IsaacLabRobot` is to Isaac Lab what :class:`stages.sim.env.mujoco_env.MujocoBatchedEnv` is
to MuJoCo: it builds the simulation and the scene, writes the states a task places, steps, pushes
and reads the articulation. The tasks themselves (:class:`stages.sim.tasks.reach_arm.ReachTask`,
:class:`stages.sim.tasks.locomotion.LocomotionTask`) are the MuJoCo backend's own definitions.

The arm is ``sim_scenes/reach/arm7.usda``, written from ``arm7.xml`` by :func:`write_arm7_usd`
(link masses, centres of mass and principal inertias copied from the compiled MJCF, revolute
joints with the same axes, frames and limits). Isaac Lab clones it into N worlds; one control
step is one Isaac Lab step of ``reach.FRAME_SKIP`` solver substeps of 0.002 s, so the control
rate (25 Hz), action semantics, observation layout, reward and success predicate are those of
:mod:`stages.sim.tasks.reach`. Servo gains, armature, passive damping and dry friction come from the
MJCF; gravity compensation with the nominal masses is modelled by zero simulated gravity plus a
downward force ``(m - m_nominal) * g`` at each link's centre of mass.

Differences from the MuJoCo backend: there is no floor (the arm collides with nothing), so
``contact_friction_scale`` has no effect; an implicit drive's force limit also bounds its damping
term; there is no offscreen renderer. Random draws follow the MuJoCo backend's order, so the
same scene, world count and seed give the same targets and initial poses on both.

Isaac Lab is imported inside functions: without it, building the environment raises
:class:`physai_core.errors.BackendUnavailableError`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from physai_core.errors import BackendUnavailableError
from stages.sim.backends.isaaclab_usd import articulation_stage, write_geom, write_revolute
from stages.sim.env.batched import RobotEpisodes, scaled_masses
from stages.sim.env.bodies import BodyLayout, mujoco_layout
from stages.sim.env.capabilities import EnvCapabilities
from stages.sim.tasks import reach
from stages.sim.tasks.reach_arm import ArmState, ReachTask

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene

BACKEND = "isaaclab"
"""Name of this backend (and of the package extra that installs it)."""

ARM7_USD = reach.ARM7_XML.with_name("arm7.usda")
"""The USD of the arm, written from ``arm7.xml`` by :func:`write_arm7_usd`."""

PHYSICS_DT = 1.0 / (reach.CONTROL_HZ * reach.FRAME_SKIP)
"""Solver timestep (s), the MJCF's 0.002 s."""

GRAVITY = 9.81
"""Gravitational acceleration (m/s^2) that the controller compensates with nominal masses."""

WARP_CACHE_ENV = "PHYSAI_WARP_CACHE"
"""Environment variable naming Warp's kernel cache folder (default: Warp's own)."""


def sim_device(requested: str = "auto") -> str:
    """The device Isaac Lab simulates on: ``auto`` is the first CUDA GPU torch sees, else the
    CPU; ``cuda`` is the first GPU; ``cpu`` the CPU."""
    if requested == "cpu":
        return "cpu"
    import torch

    if requested == "cuda" or torch.cuda.is_available():
        return "cuda:0"
    return "cpu"

_ROBOT = "robot"
_USD_ROOT = "/arm7"


def write_arm7_usd(mjcf: Path, out: Path) -> None:
    """Write the USD articulation of the MJCF arm ``mjcf`` to ``out`` (needs ``pxr``).

    Every non-mocap body becomes a rigid body at its zero-pose frame with the MJCF's mass,
    centre of mass and principal inertia; every hinge a revolute joint with its axis, frames,
    limits (degrees) and a force drive whose gains are the position actuator's; geoms that
    take part in contacts get a collision API; the ``ee`` site becomes an ``ee`` Xform.
    """
    import mujoco
    from pxr import Gf, Sdf, UsdGeom, UsdPhysics

    model = mujoco.MjModel.from_xml_path(str(mjcf))
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)

    def quat(wxyz: np.ndarray) -> Gf.Quatf:
        return Gf.Quatf(float(wxyz[0]), Gf.Vec3f(*(float(v) for v in wxyz[1:])))

    def vec(xyz: np.ndarray) -> Gf.Vec3f:
        return Gf.Vec3f(*(float(v) for v in xyz))

    def place(xform: UsdGeom.Xformable, pos: np.ndarray, wxyz: np.ndarray) -> None:
        xform.AddTranslateOp().Set(Gf.Vec3d(*(float(v) for v in pos)))
        xform.AddOrientOp().Set(quat(wxyz))

    stage, _ = articulation_stage(out, _USD_ROOT)

    body_path: dict[int, str] = {}
    for body in range(1, model.nbody):
        if model.body_mocapid[body] >= 0:
            continue
        path = f"{_USD_ROOT}/{model.body(body).name}"
        body_path[body] = path
        xform = UsdGeom.Xform.Define(stage, path)
        place(xform, data.xpos[body], data.xquat[body])
        UsdPhysics.RigidBodyAPI.Apply(xform.GetPrim())
        mass = UsdPhysics.MassAPI.Apply(xform.GetPrim())
        mass.CreateMassAttr(float(model.body_mass[body]))
        mass.CreateCenterOfMassAttr(vec(model.body_ipos[body]))
        mass.CreateDiagonalInertiaAttr(vec(model.body_inertia[body]))
        mass.CreatePrincipalAxesAttr(quat(model.body_iquat[body]))
        for geom in np.flatnonzero(model.geom_bodyid == body):
            write_geom(stage, model, int(geom), f"{path}/{model.geom(geom).name}", place)

    base = min(body_path)
    fixed = UsdPhysics.FixedJoint.Define(stage, f"{_USD_ROOT}/root_joint")
    fixed.CreateBody1Rel().SetTargets([Sdf.Path(body_path[base])])
    for joint in range(model.njnt):
        if model.jnt_type[joint] != mujoco.mjtJoint.mjJNT_HINGE:
            raise ValueError(f"{mjcf}: joint {model.joint(joint).name!r} is not a hinge")
        write_revolute(stage, model, joint, body_path, mjcf, _USD_ROOT)
    site = model.site("ee").id
    ee = UsdGeom.Xform.Define(stage, f"{body_path[int(model.site_bodyid[site])]}/ee")
    place(ee, model.site_pos[site], model.site_quat[site])
    stage.GetRootLayer().Save()


def _import_isaaclab() -> dict[str, Any]:
    """The Isaac Lab names this backend uses; a missing install raises BackendUnavailableError."""
    try:
        import isaaclab.sim as sim_utils
        import torch
        from isaaclab.actuators import ImplicitActuatorCfg
        from isaaclab.assets import ArticulationCfg
        from isaaclab.scene import InteractiveScene, InteractiveSceneCfg
        from isaaclab.sim import SimulationCfg, SimulationContext
        from isaaclab.utils import configclass
        from isaaclab_newton.physics import MJWarpSolverCfg, NewtonCfg
    except ImportError as exc:
        raise BackendUnavailableError(BACKEND, BACKEND, exc, environment=BACKEND) from exc
    return {
        "sim_utils": sim_utils,
        "torch": torch,
        "ImplicitActuatorCfg": ImplicitActuatorCfg,
        "ArticulationCfg": ArticulationCfg,
        "InteractiveScene": InteractiveScene,
        "InteractiveSceneCfg": InteractiveSceneCfg,
        "SimulationCfg": SimulationCfg,
        "SimulationContext": SimulationContext,
        "configclass": configclass,
        "MJWarpSolverCfg": MJWarpSolverCfg,
        "NewtonCfg": NewtonCfg,
    }


def robot_order(robot: Any, usd: Path, joints: Sequence[str],
                bodies: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Isaac Lab's index of each of ``joints`` and of each of ``bodies`` (the MJCF's, in its
    order); refuses an articulation whose joints or bodies are not the MJCF's."""
    joint_names = tuple(robot.joint_names)
    body_names = tuple(robot.body_names)
    if sorted(joint_names) != sorted(joints):
        raise ValueError(f"{usd}: joints {joint_names} != the MJCF's")
    if sorted(body_names) != sorted(bodies):
        raise ValueError(f"{usd}: bodies {body_names} != the MJCF's")
    return (np.array([joint_names.index(j) for j in joints]),
            np.array([body_names.index(b) for b in bodies]))


class IsaacLabRobot(RobotEpisodes):
    """The Isaac Lab backend of a robot task (Newton, MuJoCo-Warp solver, CPU or CUDA).

    It builds the simulation and the scene, writes the initial states the task places, steps
    every world one control step of the solver's substeps, pushes a floating base, reads the
    articulation's bodies and sends servo targets; the task (:class:`stages.sim.tasks.reach_arm.
    ReachTask`, :class:`stages.sim.tasks.locomotion.LocomotionTask`) comes after it among the bases.
    Only one environment may live in a process at a time (Isaac Lab's simulation context is a
    singleton): :meth:`close` it before building the next.
    """

    TASK_NAME: ClassVar[str]
    """The task id the environment runs."""
    CONTROL_HZ: ClassVar[float]
    """Its control rate (Hz)."""

    _robot: Any
    _joint_order: np.ndarray
    _body_order: np.ndarray
    _layout: BodyLayout

    def __init__(self, scene: Scene, num_worlds: int, seed: int, *,
                 num_threads: int | None = None, device: str = "auto") -> None:
        """Build ``num_worlds`` worlds of ``scene`` on ``device`` (:func:`sim_device`); call
        reset() next.

        ``num_threads`` is accepted for the factory signature; Warp's CPU kernels run on one
        thread.
        """
        self._start_robot(scene, self.TASK_NAME, num_worlds, seed, self.CONTROL_HZ)
        cache = os.environ.get(WARP_CACHE_ENV)
        il = _import_isaaclab()
        if cache:
            import warp

            warp.config.kernel_cache_dir = cache
        self._il = il
        self._torch = il["torch"]
        self._device = sim_device(device)
        self._build_robot(scene)
        self._sense()

    def _build_robot(self, scene: Scene) -> None:
        """Build the scene, set ``_robot``, ``_joint_order``, ``_body_order``, ``_layout`` and
        ``_ctrl``, and start the task."""
        raise NotImplementedError

    def _sim_cfg(self, frame_skip: int, gravity: tuple[float, float, float],
                 **solver: Any) -> Any:
        """Simulation config: the device, ``gravity`` (m/s^2), MuJoCo-Warp implicitfast with
        ``solver``'s settings, ``frame_skip`` substeps per control step."""
        il = self._il
        solver_cfg = il["MJWarpSolverCfg"](integrator="implicitfast", cone="pyramidal", **solver)
        physics = il["NewtonCfg"](solver_cfg=solver_cfg, num_substeps=frame_skip,
                                  use_cuda_graph=False)
        return il["SimulationCfg"](dt=self._control_dt, device=self._device, gravity=gravity,
                                   physics=physics, save_logs_to_file=False)

    def _robot_cfg(self, usd: Path, joints: Sequence[str], servo: Any, **init: Any) -> Any:
        """The articulation at ``usd`` cloned into every world, one implicit drive per joint
        of ``joints`` with the MJCF's gains, limits, armature and friction (``servo``'s arrays,
        in that order), its initial state ``init``."""
        il = self._il
        actuators = {
            name: il["ImplicitActuatorCfg"](
                joint_names_expr=[name],
                stiffness=float(servo.kp[j]),
                damping=float(servo.kv[j]),
                joint_effort_limit=float(servo.force_limit[j]),
                armature=float(servo.armature[j]),
                friction=float(servo.frictionloss[j]),
                viscous_friction=float(servo.damping[j]),
            )
            for j, name in enumerate(joints)
        }
        return il["ArticulationCfg"](
            prim_path="{ENV_REGEX_NS}/Robot",
            spawn=il["sim_utils"].UsdFileCfg(usd_path=str(usd)),
            init_state=il["ArticulationCfg"].InitialStateCfg(**init),
            actuators=actuators,
            soft_joint_pos_limit_factor=1.0,
        )

    def _build(self, sim_cfg: Any, name: str, assets: dict[str, tuple[type, Any]]) -> Any:
        """Build the simulation and the scene ``name`` of ``assets`` (attribute -> config type
        and config; the articulation under ``robot``) in every world; returns the robot."""
        il = self._il
        il["SimulationContext"].clear_instance()
        self._sim = il["SimulationContext"](sim_cfg)
        scene_cfg_type = il["configclass"](type(name, (il["InteractiveSceneCfg"],), {
            "__annotations__": {k: kind for k, (kind, _) in assets.items()},
            **{k: cfg for k, (_, cfg) in assets.items()}}))
        self._scene = il["InteractiveScene"](
            scene_cfg_type(num_envs=self._num_worlds, env_spacing=2.0))
        self._sim.reset()
        self._origins = self._scene.env_origins.cpu().numpy().astype(np.float64)
        return self._scene[_ROBOT]

    def _begin_episode(self) -> None:
        """Draw this episode's model randomization, if the scene has any."""
        if self._randomizes_model:
            self._randomize_model()

    def _randomize_model(self) -> None:
        """Draw per-world model parameters and write them to Newton."""
        raise NotImplementedError

    def _settle(self, worlds: np.ndarray | None) -> None:
        """Write the placed state to the simulator and recompute the kinematics (no step)."""
        self._scene.write_data_to_sim()
        self._sim.forward()
        self._scene.update(0.0)

    def _advance(self) -> None:
        """One control step: the solver's substeps in every world."""
        self._scene.write_data_to_sim()
        self._sim.step(render=False)
        self._scene.update(self._control_dt)

    def _kick(self, worlds: np.ndarray, velocity: np.ndarray) -> None:
        """Add ``velocity`` (m/s, world x and y) to the root of each of ``worlds``."""
        vel = self._read(self._robot.data.root_link_vel_w)[worlds]
        vel[:, 0:2] += velocity
        self._robot.write_root_link_velocity_to_sim_index(
            root_velocity=self._tensor(vel), env_ids=self._ids(worlds))

    def _send_servo_targets(self, targets: np.ndarray) -> None:
        """Set every servo's target (rad, the task's joint order). Shape: (N, joints)."""
        self._ctrl = np.array(targets, dtype=np.float64)
        self._robot.actuators.target_command.set_position_index(
            value=self._tensor(self._ctrl[:, np.argsort(self._joint_order)]))

    def _joints(self) -> tuple[np.ndarray, np.ndarray]:
        """Joint positions (rad) and velocities (rad/s), the task's order. Shape: (N, joints)."""
        data = self._robot.data
        return (self._read(data.joint_pos)[:, self._joint_order],
                self._read(data.joint_vel)[:, self._joint_order])

    def _body_frames(self) -> tuple[np.ndarray, np.ndarray]:
        """Body origins (m, each world's frame) and orientations (x, y, z, w), MJCF order.

        Returns:
            Shapes (N, B, 3) and (N, B, 4).
        """
        data = self._robot.data
        pos = self._read(data.body_link_pos_w)[:, self._body_order]
        xyzw = self._read(data.body_link_quat_w)[:, self._body_order]
        return pos - self._origins[:, None, :], xyzw

    @property
    def capabilities(self) -> EnvCapabilities:
        """As every robot's, and its bodies (:meth:`body_layout`)."""
        return replace(super().capabilities, body_layout=True)

    def body_layout(self) -> BodyLayout:
        """The robot's bodies and shapes as its MJCF has them (the USD was written from it)."""
        return self._layout

    def body_poses(self, worlds: list[int]) -> np.ndarray:
        """Every MJCF body's pose in each of ``worlds``, in that world's frame: the world body
        at the origin, the articulation's bodies as Isaac Lab has them, markers where the task
        puts them (:meth:`_mark`).

        Returns:
            Position (m) and orientation (w, x, y, z). Shape: (len(worlds), bodies, 7).
        """
        idx = self._world_indices(worlds)
        pos, xyzw = self._body_frames()
        names = self._layout.names
        slots = [names.index(name) for name in self._body_names()]
        poses = np.zeros((len(idx), len(names), 7))
        poses[:, :, 3] = 1.0
        poses[:, slots, :3] = pos[idx]
        poses[:, slots, 3] = xyzw[idx, :, 3]
        poses[:, slots, 4:] = xyzw[idx, :, :3]
        self._mark(poses, idx)
        return poses

    def _body_names(self) -> tuple[str, ...]:
        """The articulation's bodies by their MJCF names, in :meth:`_body_frames`' order."""
        raise NotImplementedError

    def _mark(self, poses: np.ndarray, worlds: np.ndarray) -> None:
        """Place the task's marker bodies (a target, say) in ``poses``; none by default."""

    def render(self, worlds: Sequence[int], width: int, height: int, camera: str) -> np.ndarray:
        """Not available: the kit-less backend has no offscreen renderer here.

        Raises:
            NotImplementedError: Always; render rollouts on the MuJoCo backend.
        """
        raise NotImplementedError("the isaaclab backend does not render; use the mujoco backend")

    def close(self) -> None:
        """Tear down Isaac Lab's simulation context so another environment can be built."""
        self._il["SimulationContext"].clear_instance()

    def _tensor(self, array: np.ndarray) -> Any:
        """``array`` as a float32 torch tensor on the simulation device."""
        return self._torch.as_tensor(np.ascontiguousarray(array), dtype=self._torch.float32,
                                     device=self._device)

    def _ids(self, worlds: np.ndarray) -> Any:
        """World indices as a torch long tensor on the simulation device."""
        return self._torch.as_tensor(worlds, dtype=self._torch.long, device=self._device)

    @staticmethod
    def _read(array: Any) -> np.ndarray:
        """An Isaac Lab data array (a Warp array with a torch view) as float64 NumPy."""
        return np.asarray(array.torch.cpu().numpy(), dtype=np.float64)


class _ArmParams:
    """Nominal joint and body parameters of the arm, read from the MJCF (SI units, per joint)."""

    def __init__(self) -> None:
        """Compile ``arm7.xml`` and copy what the Isaac Lab scene and randomization need."""
        import mujoco

        model = mujoco.MjModel.from_xml_path(str(reach.ARM7_XML))
        order = np.argsort(model.actuator_trnid[:, 0])
        self.joint_names = tuple(model.joint(j).name for j in range(model.njnt))
        self.kp = model.actuator_gainprm[:, 0][order].copy()
        self.kv = -model.actuator_biasprm[:, 2][order].copy()
        self.force_limit = model.actuator_forcerange[:, 1][order].copy()
        self.ctrl_low = model.actuator_ctrlrange[:, 0][order].copy()
        self.ctrl_high = model.actuator_ctrlrange[:, 1][order].copy()
        self.armature = model.dof_armature.copy()
        self.damping = model.dof_damping.copy()
        self.frictionloss = model.dof_frictionloss.copy()
        self.joint_low = model.jnt_range[:, 0].copy()
        self.joint_high = model.jnt_range[:, 1].copy()
        self.home = model.key("home").qpos.copy()
        self.body_names = tuple(
            model.body(b).name for b in range(1, model.nbody) if model.body_mocapid[b] < 0
        )
        moving = [model.body(name).id for name in self.body_names]
        self.body_mass = model.body_mass[moving].copy()
        self.body_inertia = model.body_inertia[moving].copy()
        self.links = np.flatnonzero(model.body_dofnum[moving] > 0)
        self.ee_offset = model.site_pos[model.site("ee").id].copy()
        self.ee_body = self.body_names.index(
            model.body(model.site_bodyid[model.site("ee").id]).name
        )
        self.joint_body = np.array(
            [self.body_names.index(model.body(model.jnt_bodyid[j]).name) for j in range(model.njnt)]
        )
        self.joint_axis = model.jnt_axis.copy()
        self.layout = mujoco_layout(model)
        """The MJCF's bodies and shapes, which the USD articulation was written from."""
        self.mocap_bodies = tuple(b for b in range(model.nbody) if model.body_mocapid[b] >= 0)


class IsaacLabReachEnv(IsaacLabRobot, ReachTask):
    """N worlds of reach-v0 on Isaac Lab (Newton, MuJoCo-Warp solver, CPU or CUDA): the task
    of :class:`stages.sim.tasks.reach_arm.ReachTask`, as MuJoCo's
    :class:`stages.sim.tasks.reach.ReachEnv` runs it.

    Implements :class:`stages.sim.env.batched.BatchedEnv`. Only one environment may live in a
    process at a time (Isaac Lab's simulation context is a singleton): :meth:`close` it before
    building the next.
    """

    TASK_NAME = reach.TASK_NAME
    CONTROL_HZ = reach.CONTROL_HZ

    def _build_robot(self, scene: Scene) -> None:
        """The arm in every world, without gravity (its controller compensates it)."""
        if scene.config.randomization.push_interval_steps is not None:
            raise ValueError(f"{scene.path}: pushes need a free-floating base")
        p = self._p = _ArmParams()
        self._layout = p.layout
        robot = self._robot_cfg(
            ARM7_USD, p.joint_names, p,
            joint_pos={n: float(q) for n, q in zip(p.joint_names, p.home, strict=True)})
        sim_cfg = self._sim_cfg(reach.FRAME_SKIP, (0.0, 0.0, 0.0), njmax=reach.NUM_JOINTS * 4,
                                nconmax=1, disable_contacts=True)
        self._robot = self._build(sim_cfg, "ReachSceneCfg",
                                  {_ROBOT: (self._il["ArticulationCfg"], robot)})
        self._joint_order, self._body_order = robot_order(self._robot, ARM7_USD, p.joint_names,
                                                          p.body_names)
        self._ctrl = np.zeros((self._num_worlds, reach.NUM_JOINTS))
        self._extra_mass = np.zeros((self._num_worlds, len(p.body_names)))
        self._start_reach(reach.ARM, p.home, (p.joint_low, p.joint_high),
                          (p.ctrl_low, p.ctrl_high))

    def _place_arm(self, qpos: np.ndarray) -> None:
        """Put every arm at ``qpos``, still, its servos holding it."""
        isaac = qpos[:, np.argsort(self._joint_order)]
        self._robot.write_joint_position_to_sim_index(position=self._tensor(isaac))
        self._robot.write_joint_velocity_to_sim_index(velocity=self._tensor(np.zeros_like(isaac)))
        self._send_servo_targets(qpos)

    def _read_arm(self) -> ArmState:
        """Joints from Isaac Lab, the end effector from its link's frame."""
        joint_pos, joint_vel = self._joints()
        pos, xyzw = self._body_frames()
        b = self._p.ee_body
        ee = pos[:, b] + _quat_xyzw_to_matrix(xyzw[:, b]) @ self._p.ee_offset
        return ArmState(joint_pos=joint_pos, joint_vel=joint_vel, ee_pos=ee)

    def _ee_jacobian(self) -> np.ndarray:
        """The end-effector position Jacobian from the link frames: column i is
        ``a_i x (ee - o_i)`` with ``a_i`` joint i's world axis and ``o_i`` its world origin."""
        p = self._p
        pos, xyzw = self._body_frames()
        rot = _quat_xyzw_to_matrix(xyzw[:, p.joint_body])
        axes = np.einsum("njab,jb->nja", rot, p.joint_axis)
        ee = self._state.ee_pos
        return np.cross(axes, ee[:, None, :] - pos[:, p.joint_body]).transpose(0, 2, 1)

    def _body_names(self) -> tuple[str, ...]:
        """The arm's moving bodies, MJCF order."""
        return self._p.body_names

    def _mark(self, poses: np.ndarray, worlds: np.ndarray) -> None:
        """The target marker at each world's target."""
        for k in self._p.mocap_bodies:
            poses[:, k, :3] = self._target[worlds]

    def _randomize_model(self) -> None:
        """Draw per-world masses, payload, damping, friction and gains and write them to Newton.

        Draws come in the MuJoCo backend's order (mass, payload, damping, friction, gain,
        contact friction). Heavier links get a downward force for their extra weight, as the
        nominal-mass gravity compensation leaves it uncompensated.
        """
        p, nj = self._p, reach.NUM_JOINTS
        draws = self._draw_model(p.links.size, nj, nj)
        body_mass, factor = scaled_masses(p.body_mass, p.links, draws, p.ee_body)
        robot, to_isaac = self._robot, np.argsort(self._joint_order)
        robot.set_masses_index(masses=self._tensor(body_mass))
        inertia = np.zeros((self._num_worlds, len(p.body_names), 9))
        inertia[:, :, [0, 4, 8]] = p.body_inertia * factor[:, :, None]
        robot.set_inertias_index(inertias=self._tensor(inertia))
        robot.write_joint_viscous_friction_coefficient_to_sim_index(
            joint_viscous_friction_coeff=self._tensor((p.damping * draws.damping)[:, to_isaac]))
        robot.write_joint_friction_coefficient_to_sim_index(
            joint_friction_coeff=self._tensor((p.frictionloss * draws.friction)[:, to_isaac]))
        robot.write_joint_stiffness_to_sim_index(
            stiffness=self._tensor((p.kp * draws.gain)[:, to_isaac]))
        self._extra_mass = body_mass - p.body_mass
        forces = np.zeros((self._num_worlds, len(p.body_names), 3))
        forces[:, :, 2] = -GRAVITY * self._extra_mass
        robot.permanent_wrench_composer.set_forces_and_torques_index(
            forces=self._tensor(forces), torques=self._tensor(np.zeros_like(forces)),
            is_global=True)


def _quat_xyzw_to_matrix(quat: np.ndarray) -> np.ndarray:
    """Rotation matrices of unit quaternions (x, y, z, w). Shape: (..., 4) -> (..., 3, 3)."""
    x, y, z, w = np.moveaxis(quat, -1, 0)
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
            np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
            np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )
