"""reach-v0 on Isaac Lab 3 in its kit-less Newton mode: the MuJoCo-Warp solver on the CPU.

The arm is ``sim_scenes/reach/arm7.usda``, written from ``arm7.xml`` by :func:`write_arm7_usd`
(link masses, centres of mass and principal inertias copied from the compiled MJCF, revolute
joints with the same axes, frames and limits). Isaac Lab clones it into N worlds; one control
step is one Isaac Lab step of ``reach.FRAME_SKIP`` solver substeps of 0.002 s, so the control
rate (25 Hz), action semantics, observation layout, reward and success predicate are those of
:mod:`stages.sim.reach`. Servo gains, armature, passive damping and dry friction come from the
MJCF; gravity compensation with the nominal masses is modelled by zero simulated gravity plus a
downward force ``(m - m_nominal) * g`` at each link's centre of mass.

Differences from the MuJoCo backend: there is no floor (the arm collides with nothing), so
``contact_friction_scale`` has no effect; an implicit drive's force limit also bounds its damping
term; there is no offscreen renderer. Random draws follow the MuJoCo backend's order, so the
same scene, world count and seed give the same targets and initial poses on both.

Isaac Lab is imported inside functions: without it, building the environment raises
:class:`stages.errors.BackendUnavailableError`.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.errors import BackendUnavailableError
from stages.sim import reach
from stages.sim.batched import EpisodeWorlds
from stages.sim.bodies import BodyLayout, mujoco_layout

if TYPE_CHECKING:
    from stages.sim.scene import Scene

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
_AXES = ("X", "Y", "Z")


def write_arm7_usd(mjcf: Path, out: Path) -> None:
    """Write the USD articulation of the MJCF arm ``mjcf`` to ``out`` (needs ``pxr``).

    Every non-mocap body becomes a rigid body at its zero-pose frame with the MJCF's mass,
    centre of mass and principal inertia; every hinge a revolute joint with its axis, frames,
    limits (degrees) and a force drive whose gains are the position actuator's; geoms that
    take part in contacts get a collision API; the ``ee`` site becomes an ``ee`` Xform.
    """
    import mujoco
    from pxr import Gf, Sdf, Usd, UsdGeom, UsdPhysics

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

    stage = Usd.Stage.CreateNew(str(out))
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    UsdPhysics.SetStageKilogramsPerUnit(stage, 1.0)
    root = UsdGeom.Xform.Define(stage, _USD_ROOT)
    stage.SetDefaultPrim(root.GetPrim())
    UsdPhysics.ArticulationRootAPI.Apply(root.GetPrim())

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
            _write_geom(stage, model, int(geom), f"{path}/{model.geom(geom).name}", place)

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


def write_revolute(stage: Any, model: Any, joint: int, body_path: dict[int, str], mjcf: Path,
                   root: str) -> None:
    """Write MJCF hinge ``joint`` as a USD revolute joint under ``root``/joints: its bodies,
    frames, axis and limits (degrees), and a force drive with its position servo's gains per
    degree and force limit. The hinge must lie along +x, +y or +z of its body."""
    from pxr import Gf, Sdf, UsdPhysics

    def quat(wxyz: np.ndarray) -> Gf.Quatf:
        return Gf.Quatf(float(wxyz[0]), Gf.Vec3f(*(float(v) for v in wxyz[1:])))

    axis = np.flatnonzero(model.jnt_axis[joint])
    if axis.size != 1 or model.jnt_axis[joint][axis[0]] != 1.0:
        raise ValueError(f"{mjcf}: joint {model.joint(joint).name!r} is not along +x, +y or +z")
    child = int(model.jnt_bodyid[joint])
    parent = int(model.body_parentid[child])
    rev = UsdPhysics.RevoluteJoint.Define(stage, f"{root}/joints/{model.joint(joint).name}")
    rev.CreateBody0Rel().SetTargets([Sdf.Path(body_path[parent])])
    rev.CreateBody1Rel().SetTargets([Sdf.Path(body_path[child])])
    rev.CreateLocalPos0Attr(Gf.Vec3f(*(float(v) for v in model.body_pos[child])))
    rev.CreateLocalRot0Attr(quat(model.body_quat[child]))
    rev.CreateLocalPos1Attr(Gf.Vec3f(0.0, 0.0, 0.0))
    rev.CreateLocalRot1Attr(Gf.Quatf(1.0))
    rev.CreateAxisAttr(_AXES[int(axis[0])])
    rev.CreateLowerLimitAttr(float(np.degrees(model.jnt_range[joint][0])))
    rev.CreateUpperLimitAttr(float(np.degrees(model.jnt_range[joint][1])))
    actuator = int(np.flatnonzero(model.actuator_trnid[:, 0] == joint)[0])
    drive = UsdPhysics.DriveAPI.Apply(rev.GetPrim(), "angular")
    drive.CreateTypeAttr("force")
    per_degree = math.pi / 180.0
    drive.CreateStiffnessAttr(float(model.actuator_gainprm[actuator][0]) * per_degree)
    drive.CreateDampingAttr(float(-model.actuator_biasprm[actuator][2]) * per_degree)
    drive.CreateMaxForceAttr(float(model.actuator_forcerange[actuator][1]))


def _write_geom(stage: Any, model: Any, geom: int, path: str, place: Any) -> None:
    """Write MJCF geom ``geom`` (capsule, cylinder or box) as a USD gprim at ``path``."""
    import mujoco
    from pxr import Gf, UsdGeom, UsdPhysics

    kind = model.geom_type[geom]
    size = model.geom_size[geom]
    if kind == mujoco.mjtGeom.mjGEOM_CAPSULE:
        prim = UsdGeom.Capsule.Define(stage, path)
    elif kind == mujoco.mjtGeom.mjGEOM_CYLINDER:
        prim = UsdGeom.Cylinder.Define(stage, path)
    elif kind == mujoco.mjtGeom.mjGEOM_BOX:
        prim = UsdGeom.Cube.Define(stage, path)
    else:
        raise ValueError(f"geom {model.geom(geom).name!r}: unsupported type {kind}")
    place(prim, model.geom_pos[geom], model.geom_quat[geom])
    if kind == mujoco.mjtGeom.mjGEOM_BOX:
        prim.CreateSizeAttr(1.0)
        prim.AddScaleOp().Set(Gf.Vec3f(*(float(2.0 * s) for s in size)))
    else:
        prim.CreateRadiusAttr(float(size[0]))
        prim.CreateHeightAttr(float(2.0 * size[1]))
        prim.CreateAxisAttr("Z")
    prim.CreateDisplayColorAttr([Gf.Vec3f(*(float(c) for c in model.geom_rgba[geom][:3]))])
    if model.geom_contype[geom] or model.geom_conaffinity[geom]:
        UsdPhysics.CollisionAPI.Apply(prim.GetPrim())


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


class _ArmParams:
    """Nominal joint and body parameters of the arm, read from the MJCF (SI units, per joint)."""

    def __init__(self) -> None:
        """Compile ``arm7.xml`` and copy what the Isaac Lab scene and randomization need."""
        import mujoco

        model = mujoco.MjModel.from_xml_path(str(reach.ARM7_XML))
        order = model.actuator_trnid[:, 0]
        self.joint_names = tuple(model.joint(j).name for j in range(model.njnt))
        self.kp = model.actuator_gainprm[:, 0][np.argsort(order)].copy()
        self.kv = -model.actuator_biasprm[:, 2][np.argsort(order)].copy()
        self.force_limit = model.actuator_forcerange[:, 1][np.argsort(order)].copy()
        self.ctrl_low = model.actuator_ctrlrange[:, 0][np.argsort(order)].copy()
        self.ctrl_high = model.actuator_ctrlrange[:, 1][np.argsort(order)].copy()
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


class IsaacLabReachEnv(EpisodeWorlds):
    """N worlds of reach-v0 on Isaac Lab (Newton, MuJoCo-Warp solver, CPU).

    Implements :class:`stages.sim.batched.BatchedEnv`. Only one environment may live in a
    process at a time (Isaac Lab's simulation context is a singleton): :meth:`close` it before
    building the next.
    """

    def __init__(
        self, scene: Scene, num_worlds: int, seed: int, *, num_threads: int | None = None,
        device: str = "auto",
    ) -> None:
        """Build ``num_worlds`` worlds of ``scene`` on ``device`` (:func:`sim_device`); call
        reset() next.

        ``num_threads`` is accepted for the factory signature; Warp's CPU kernels run on one
        thread.
        """
        if scene.config.task != reach.TASK_NAME:
            raise ValueError(
                f"{reach.TASK_NAME} cannot run scene {scene.path} of task {scene.config.task!r}"
            )
        if num_worlds < 1:
            raise ValueError(f"num_worlds must be >= 1, got {num_worlds}")
        rand = scene.config.randomization
        if rand.push_interval_steps is not None:
            raise ValueError(f"{scene.path}: pushes need a free-floating base")
        cache = os.environ.get(WARP_CACHE_ENV)
        il = _import_isaaclab()
        if cache:
            import warp

            warp.config.kernel_cache_dir = cache
        self._il = il
        self._torch = il["torch"]
        self._device = sim_device(device)
        self._p = _ArmParams()
        self._rand = rand
        self._num_worlds = num_worlds
        self._episode_steps = scene.config.episode_steps
        self._rng = np.random.default_rng(seed)
        self._randomizes_model = any(
            s != (1.0, 1.0)
            for s in (rand.mass_scale, rand.damping_scale, rand.friction_scale, rand.gain_scale)
        ) or rand.payload_mass != (0.0, 0.0)

        il["SimulationContext"].clear_instance()
        self._sim = il["SimulationContext"](self._sim_cfg())
        self._scene = il["InteractiveScene"](self._scene_cfg(num_worlds))
        self._sim.reset()
        self._arm = self._scene[_ROBOT]
        if tuple(self._arm.joint_names) != self._p.joint_names:
            raise ValueError(f"{ARM7_USD}: joints {self._arm.joint_names} != the MJCF's")
        if tuple(self._arm.body_names) != self._p.body_names:
            raise ValueError(f"{ARM7_USD}: bodies {self._arm.body_names} != the MJCF's")
        self._origins = self._scene.env_origins.cpu().numpy().astype(np.float64)

        self._ctrl = np.zeros((num_worlds, reach.NUM_JOINTS))
        self._target = np.zeros((num_worlds, 3))
        self._extra_mass = np.zeros((num_worlds, len(self._p.body_names)))
        self._pending: deque[np.ndarray] = deque()
        self._steps_done = -1

    @property
    def obs_dim(self) -> int:
        """Length of one observation vector (23)."""
        return len(reach.OBS_NAMES)

    @property
    def act_dim(self) -> int:
        """Length of one action vector (7)."""
        return reach.NUM_JOINTS

    def reset(self) -> np.ndarray:
        """Draw randomization, targets and initial poses per world and start a new episode.

        Returns:
            Observations. Shape: (num_worlds, 23), float32.
        """
        if self._randomizes_model:
            self._randomize_model()
        n, p, rand, rng = self._num_worlds, self._p, self._rand, self._rng
        self._target = rng.uniform(rand.target_low, rand.target_high, size=(n, 3))
        noise = rng.uniform(-reach.HOME_NOISE, reach.HOME_NOISE, size=(n, reach.NUM_JOINTS))
        qpos0 = np.clip(p.home + noise, p.joint_low, p.joint_high)
        self._ctrl = qpos0.copy()
        arm = self._arm
        arm.write_joint_position_to_sim_index(position=self._tensor(qpos0))
        arm.write_joint_velocity_to_sim_index(velocity=self._tensor(np.zeros_like(qpos0)))
        self._set_position_targets()
        self._scene.write_data_to_sim()
        self._sim.forward()
        self._scene.update(0.0)
        self._pending = deque(
            np.zeros((n, reach.NUM_JOINTS)) for _ in range(rand.action_delay_steps)
        )
        self._steps_done = 0
        return self._observe()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Move every servo target by ACTION_SCALE * action and advance one control step.

        Args:
            actions: Normalized actions, clipped to [-1, 1]. Shape: (num_worlds, 7).

        Returns:
            ``(obs, reward, done)``: shape (num_worlds, 23) float32, (num_worlds,) float32 and
            (num_worlds,) bool, True for every world at the last step of the episode.
        """
        actions = self._checked_actions(actions)
        applied = np.clip(actions, -1.0, 1.0)
        if self._pending:
            self._pending.append(applied)
            applied = self._pending.popleft()
        self._ctrl = np.clip(
            self._ctrl + reach.ACTION_SCALE * applied, self._p.ctrl_low, self._p.ctrl_high
        )
        self._set_position_targets()
        self._scene.write_data_to_sim()
        self._sim.step(render=False)
        self._scene.update(1.0 / reach.CONTROL_HZ)
        self._steps_done += 1
        reward = (-self._distance()).astype(np.float32)
        done = np.full(self._num_worlds, self._steps_done >= self._episode_steps)
        return self._observe(), reward, done

    def success(self) -> np.ndarray:
        """Whether each end effector is within 0.03 m of its target. Shape: (num_worlds,), bool."""
        self._require_episode()
        return self._distance() < reach.SUCCESS_DISTANCE

    def expert_action(self) -> np.ndarray:
        """The damped-least-squares expert of :meth:`stages.sim.reach.ReachEnv.expert_action`.

        The end-effector position Jacobian is computed from the link frames: column i is
        ``a_i x (ee - o_i)`` with ``a_i`` joint i's world axis and ``o_i`` its world origin.

        Returns:
            Actions in [-1, 1]. Shape: (num_worlds, 7), float32.
        """
        self._require_episode()
        p = self._p
        pos, rot = self._link_frames()
        ee = self._ee_pos(pos, rot)
        axes = np.einsum("njab,jb->nja", rot[:, p.joint_body], p.joint_axis)
        jac = np.cross(axes, ee[:, None, :] - pos[:, p.joint_body]).transpose(0, 2, 1)
        jac_t = jac.transpose(0, 2, 1)
        gram = jac @ jac_t + reach.EXPERT_DAMPING**2 * np.eye(3)
        pinv = jac_t @ np.linalg.inv(gram)
        error = reach.EXPERT_GAIN * (self._target - ee)
        dq = (pinv @ error[:, :, None])[:, :, 0]
        null = np.eye(reach.NUM_JOINTS) - pinv @ jac
        pull = reach.EXPERT_NULL_GAIN * (p.home - self._qpos())
        dq += (null @ pull[:, :, None])[:, :, 0]
        action = dq / reach.ACTION_SCALE
        action /= np.maximum(1.0, np.abs(action).max(axis=1, keepdims=True))
        return action.astype(np.float32)

    def body_layout(self) -> BodyLayout:
        """The arm's bodies and shapes as its MJCF has them (the USD was written from it)."""
        return self._p.layout

    def body_poses(self, worlds: list[int]) -> np.ndarray:
        """Every MJCF body's pose in each of ``worlds``, in that world's frame: the fixed world
        body at the origin, the links as Isaac Lab has them, the target marker at the target.

        Returns:
            Position (m) and orientation (w, x, y, z). Shape: (len(worlds), bodies, 7).
        """
        data = self._arm.data
        pos = data.body_link_pos_w.torch.cpu().numpy().astype(np.float64)
        pos -= self._origins[:, None, :]
        xyzw = data.body_link_quat_w.torch.cpu().numpy().astype(np.float64)
        names = self._p.layout.names
        idx = np.asarray(worlds, dtype=np.int64)
        poses = np.zeros((len(idx), len(names), 7))
        poses[:, :, 3] = 1.0
        for b, name in enumerate(self._p.body_names):
            k = names.index(name)
            poses[:, k, :3] = pos[idx, b]
            poses[:, k, 3] = xyzw[idx, b, 3]
            poses[:, k, 4:] = xyzw[idx, b, :3]
        for k in self._p.mocap_bodies:
            poses[:, k, :3] = self._target[idx]
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
        """Simulation config: the device, no gravity, MuJoCo-Warp implicitfast, FRAME_SKIP
        substeps."""
        il = self._il
        solver = il["MJWarpSolverCfg"](
            integrator="implicitfast",
            cone="pyramidal",
            njmax=reach.NUM_JOINTS * 4,
            nconmax=1,
            disable_contacts=True,
        )
        physics = il["NewtonCfg"](
            solver_cfg=solver, num_substeps=reach.FRAME_SKIP, use_cuda_graph=False
        )
        return il["SimulationCfg"](
            dt=1.0 / reach.CONTROL_HZ,
            device=self._device,
            gravity=(0.0, 0.0, 0.0),
            physics=physics,
            save_logs_to_file=False,
        )

    def _scene_cfg(self, num_worlds: int) -> Any:
        """Scene config: the USD arm cloned into ``num_worlds`` worlds with the MJCF's servos."""
        il, p = self._il, self._p
        actuators = {
            name: il["ImplicitActuatorCfg"](
                joint_names_expr=[name],
                stiffness=float(p.kp[j]),
                damping=float(p.kv[j]),
                effort_limit_sim=float(p.force_limit[j]),
                armature=float(p.armature[j]),
                friction=float(p.frictionloss[j]),
                viscous_friction=float(p.damping[j]),
            )
            for j, name in enumerate(p.joint_names)
        }
        robot = il["ArticulationCfg"](
            prim_path="{ENV_REGEX_NS}/Robot",
            spawn=il["sim_utils"].UsdFileCfg(usd_path=str(ARM7_USD)),
            init_state=il["ArticulationCfg"].InitialStateCfg(
                joint_pos={n: float(q) for n, q in zip(p.joint_names, p.home, strict=True)}
            ),
            actuators=actuators,
            soft_joint_pos_limit_factor=1.0,
        )
        scene_cfg_type = il["configclass"](
            type(
                "ReachSceneCfg",
                (il["InteractiveSceneCfg"],),
                {"__annotations__": {_ROBOT: il["ArticulationCfg"]}, _ROBOT: robot},
            )
        )
        return scene_cfg_type(num_envs=num_worlds, env_spacing=2.0)

    def _randomize_model(self) -> None:
        """Draw per-world masses, payload, damping, friction and gains and write them to Newton.

        Draws come in the MuJoCo backend's order (mass, payload, damping, friction, gain,
        contact friction). Heavier links get a downward force for their extra weight, as the
        nominal-mass gravity compensation leaves it uncompensated.
        """
        n, p, rand, rng = self._num_worlds, self._p, self._rand, self._rng
        nj = reach.NUM_JOINTS
        mass = rng.uniform(*rand.mass_scale, size=(n, p.links.size))
        payload = rng.uniform(*rand.payload_mass, size=n)
        damping = rng.uniform(*rand.damping_scale, size=(n, nj))
        friction = rng.uniform(*rand.friction_scale, size=(n, nj))
        gain = rng.uniform(*rand.gain_scale, size=(n, nj))
        rng.uniform(*rand.contact_friction_scale, size=n)

        scale = np.ones((n, len(p.body_names)))
        scale[:, p.links] = mass
        body_mass = p.body_mass * scale
        body_mass[:, p.ee_body] += payload
        factor = body_mass / p.body_mass
        arm = self._arm
        arm.set_masses_index(masses=self._tensor(body_mass))
        inertia = np.zeros((n, len(p.body_names), 9))
        inertia[:, :, [0, 4, 8]] = p.body_inertia * factor[:, :, None]
        arm.set_inertias_index(inertias=self._tensor(inertia))
        arm.write_joint_viscous_friction_coefficient_to_sim_index(
            joint_viscous_friction_coeff=self._tensor(p.damping * damping)
        )
        arm.write_joint_friction_coefficient_to_sim_index(
            joint_friction_coeff=self._tensor(p.frictionloss * friction)
        )
        arm.write_joint_stiffness_to_sim_index(stiffness=self._tensor(p.kp * gain))
        self._extra_mass = body_mass - p.body_mass
        forces = np.zeros((n, len(p.body_names), 3))
        forces[:, :, 2] = -GRAVITY * self._extra_mass
        arm.permanent_wrench_composer.set_forces_and_torques_index(
            forces=self._tensor(forces),
            torques=self._tensor(np.zeros_like(forces)),
            is_global=True,
        )

    def _tensor(self, array: np.ndarray) -> Any:
        """``array`` as a float32 torch tensor on the simulation device."""
        return self._torch.as_tensor(np.ascontiguousarray(array), dtype=self._torch.float32,
                                     device=self._device)

    def _set_position_targets(self) -> None:
        """Send the servo targets (rad). Shape of the targets: (N, 7)."""
        self._arm.actuators.target_command.set_position_index(value=self._tensor(self._ctrl))

    def _qpos(self) -> np.ndarray:
        """Joint positions (rad). Shape: (N, 7)."""
        return self._arm.data.joint_pos.torch.cpu().numpy().astype(np.float64)

    def _qvel(self) -> np.ndarray:
        """Joint velocities (rad/s). Shape: (N, 7)."""
        return self._arm.data.joint_vel.torch.cpu().numpy().astype(np.float64)

    def _link_frames(self) -> tuple[np.ndarray, np.ndarray]:
        """Link origins (m, each world's frame) and rotations.

        Returns:
            Positions, shape (N, B, 3), and rotation matrices, shape (N, B, 3, 3).
        """
        data = self._arm.data
        pos = data.body_link_pos_w.torch.cpu().numpy().astype(np.float64)
        pos -= self._origins[:, None, :]
        quat = data.body_link_quat_w.torch.cpu().numpy().astype(np.float64)
        return pos, _quat_xyzw_to_matrix(quat)

    def _ee_pos(self, pos: np.ndarray | None = None, rot: np.ndarray | None = None) -> np.ndarray:
        """End-effector position (m, world frame of each world). Shape: (N, 3)."""
        if pos is None or rot is None:
            pos, rot = self._link_frames()
        b = self._p.ee_body
        return pos[:, b] + rot[:, b] @ self._p.ee_offset

    def _distance(self) -> np.ndarray:
        """End-effector-to-target distance (m). Shape: (N,)."""
        return np.linalg.norm(self._target - self._ee_pos(), axis=1)

    def _observe(self) -> np.ndarray:
        """Joint state, end effector, target, difference, plus noise. Shape: (N, 23), float32."""
        ee = self._ee_pos()
        obs = np.concatenate(
            [self._qpos(), self._qvel(), ee, self._target, self._target - ee], axis=1
        )
        if self._rand.obs_noise_std > 0.0:
            obs = obs + self._rng.normal(0.0, self._rand.obs_noise_std, size=obs.shape)
        return obs.astype(np.float32)



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
