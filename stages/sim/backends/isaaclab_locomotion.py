"""locomotion-v0 on Isaac Lab 3 in its kit-less Newton mode: the MuJoCo-Warp solver, on the CPU
or a CUDA GPU.

The quadruped is ``sim_scenes/locomotion/quadruped.usda``, written from ``quadruped.xml`` by
:func:`write_quadruped_usd`: a free-floating torso as the articulation root, every body with
the compiled MJCF's mass, centre of mass and principal inertia, the hinges as revolute joints
with the same axes, frames and limits, and the geoms that touch the floor (torso box, feet) as
colliders with the MJCF's friction and contact stiffness. Self-collision is off, as the MJCF's
``contype``/``conaffinity`` masks have it. The floor is not part of the robot: every scene gets
a static collision plane at z = 0, shared by all worlds (:func:`spawn_floor`).

One control step is one Isaac Lab step of :data:`~stages.sim.tasks.locomotion.FRAME_SKIP` solver
substeps of 0.005 s (50 Hz), so action semantics, observation layout, reward, fall and success
predicates, the command and the scripted trot are those of :mod:`stages.sim.tasks.locomotion`.
Random draws follow :class:`~stages.sim.tasks.locomotion.LocomotionEnv`'s order, so the same scene,
world count and seed give the same commands, initial poses, randomization and pushes on both.

Differences from the MuJoCo backend: an implicit drive's force limit also bounds its damping
term; the contact-friction factor scales the robot's colliders, which win over the floor's
friction by MuJoCo contact priority (MuJoCo's own backend scales both, and takes the larger);
there is no offscreen renderer.

Isaac Lab is imported inside functions: without it, building the environment raises
:class:`physai_core.errors.BackendUnavailableError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.sim.backends.isaaclab_robot import IsaacLabRobot, _quat_xyzw_to_matrix, robot_order
from stages.sim.backends.isaaclab_usd import articulation_stage, write_geom, write_revolute
from stages.sim.env.batched import scaled_masses
from stages.sim.tasks import locomotion as loco

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene

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
    from pxr import Sdf

    model = mujoco.MjModel.from_xml_path(str(mjcf))
    data = mujoco.MjData(model)
    stand = model.key("stand")
    data.qpos[:] = stand.qpos
    mujoco.mj_kinematics(model, data)

    stage, root = articulation_stage(out, _USD_ROOT)
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
        write_geom(stage, model, geom, path, place)
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


class IsaacLabLocomotionEnv(IsaacLabRobot, loco.LocomotionTask):
    """N worlds of locomotion-v0 on Isaac Lab (Newton, MuJoCo-Warp solver, CPU or CUDA): the
    task of :class:`stages.sim.tasks.locomotion.LocomotionTask`, as MuJoCo's
    :class:`~stages.sim.tasks.locomotion.LocomotionEnv` runs it.

    Implements :class:`stages.sim.env.batched.BatchedEnv`, with ``fallen()``, ``respawn()`` and
    ``step(..., restart_fallen=True)`` for PPO's per-world episodes. Only one environment may
    live in a process at a time (Isaac Lab's simulation context is a singleton): :meth:`close`
    it before building the next.
    """

    TASK_NAME = loco.TASK_NAME
    CONTROL_HZ = loco.CONTROL_HZ

    def _build_robot(self, scene: Scene) -> None:
        """The quadruped in every world, on a floor they share, under gravity."""
        import mujoco

        p = self._p = loco.QuadrupedParams(mujoco.MjModel.from_xml_path(str(loco.QUADRUPED_XML)))
        self._layout = p.layout
        stand = p.stand_qpos
        robot = self._robot_cfg(
            QUADRUPED_USD, loco.JOINTS, p,
            pos=tuple(float(v) for v in stand[0:3]),
            rot=(float(stand[4]), float(stand[5]), float(stand[6]), float(stand[3])),
            joint_pos={n: float(q) for n, q in zip(loco.JOINTS, p.default, strict=True)})
        from isaaclab.assets import AssetBaseCfg

        floor = AssetBaseCfg(prim_path=f"/World/{_FLOOR}",
                             spawn=self._il["sim_utils"].SpawnerCfg(func=spawn_floor),
                             collision_group=-1)
        sim_cfg = self._sim_cfg(loco.FRAME_SKIP, (0.0, 0.0, -9.81), njmax=MAX_CONSTRAINT_ROWS,
                                nconmax=MAX_CONTACTS, iterations=SOLVER_ITERATIONS,
                                tolerance=SOLVER_TOLERANCE)
        self._robot = self._build(sim_cfg, "LocomotionSceneCfg", {
            _FLOOR: (AssetBaseCfg, floor), _ROBOT: (self._il["ArticulationCfg"], robot)})
        self._joint_order, self._body_order = robot_order(self._robot, QUADRUPED_USD,
                                                          loco.JOINTS, p.body_names)
        self._nominal_inertia = self._robot.data.body_inertia.torch.cpu().numpy()
        self._nominal_mu = self._friction_tensor().cpu().numpy().copy()
        """Sliding friction of the robot's shapes as the USD sets it. Shape: (N, shapes)."""
        self._kp = np.tile(p.kp, (self._num_worlds, 1))
        self._ctrl = np.tile(p.default, (self._num_worlds, 1))
        self._start_task()

    def _place(self, worlds: np.ndarray, xy: np.ndarray, joint_noise: np.ndarray) -> None:
        """Stand ``worlds``' robots upright at ``xy``, joints at the standing pose plus
        ``joint_noise``, still, servos holding the standing pose."""
        p, k = self._p, worlds.size
        pose = np.zeros((k, 7))
        pose[:, 0:2] = xy
        pose[:, 2] = p.stand_qpos[2]
        pose[:, :3] += self._origins[worlds]
        pose[:, 3:6] = p.stand_qpos[4:7]
        pose[:, 6] = p.stand_qpos[3]
        ids, robot = self._ids(worlds), self._robot
        robot.write_root_pose_to_sim_index(root_pose=self._tensor(pose), env_ids=ids)
        robot.write_root_velocity_to_sim_index(root_velocity=self._tensor(np.zeros((k, 6))),
                                               env_ids=ids)
        qpos = (p.stand_qpos[7:] + joint_noise)[:, np.argsort(self._joint_order)]
        robot.write_joint_position_to_sim_index(position=self._tensor(qpos), env_ids=ids)
        robot.write_joint_velocity_to_sim_index(velocity=self._tensor(np.zeros_like(qpos)),
                                                env_ids=ids)
        ctrl = self._ctrl.copy()
        ctrl[worlds] = p.default
        self._send_servo_targets(ctrl)

    def _read_quadruped(self) -> loco.QuadrupedState:
        """The torso's pose and velocities, joints, the servos' torques (the position servo's,
        clipped to its limit) and the feet, from Isaac Lab."""
        p, data = self._p, self._robot.data
        joint_pos, joint_vel = self._joints()
        torque = np.clip(self._kp * (self._ctrl - joint_pos) - p.kv * joint_vel,
                         -p.force_limit, p.force_limit)
        pos, xyzw = self._body_frames()
        shanks = _quat_xyzw_to_matrix(xyzw[:, p.shanks])
        feet = pos[:, p.shanks] + np.einsum("nlij,lj->nli", shanks, p.foot_offset)
        return loco.QuadrupedState(
            base_pos=self._read(data.root_link_pos_w) - self._origins,
            rot=_quat_xyzw_to_matrix(self._read(data.root_link_quat_w)),
            lin_vel=self._read(data.root_link_lin_vel_b),
            ang_vel=self._read(data.root_link_ang_vel_b),
            joint_pos=joint_pos, joint_vel=joint_vel, joint_torque=torque,
            foot_height=feet[:, :, 2])

    def _body_names(self) -> tuple[str, ...]:
        """The quadruped's bodies, MJCF order."""
        return self._p.body_names

    def _friction_tensor(self) -> Any:
        """Newton's per-world sliding friction of the robot's shapes (a writable torch view)."""
        import warp

        model = self._sim.physics_manager.get_model()
        binding = self._robot._root_view.get_attribute("shape_material_mu", model)[:, 0]
        return warp.to_torch(binding)

    def _randomize_model(self) -> None:
        """Draw per-world masses, payload, damping, friction, gains and contact friction and
        write them to Newton, in LocomotionEnv's order and sizes."""
        p = self._p
        draws = self._draw_model(p.links.size, p.num_dofs, loco.NUM_JOINTS)
        body_mass, factor = scaled_masses(p.body_mass, p.links, draws, p.torso)
        robot, order = self._robot, self._body_order
        isaac_mass = np.zeros_like(body_mass)
        isaac_mass[:, order] = body_mass
        isaac_factor = np.ones_like(factor)
        isaac_factor[:, order] = factor
        robot.set_masses_index(masses=self._tensor(isaac_mass))
        robot.set_inertias_index(
            inertias=self._tensor(self._nominal_inertia * isaac_factor[:, :, None]))
        to_isaac = np.argsort(self._joint_order)
        robot.write_joint_viscous_friction_coefficient_to_sim_index(
            joint_viscous_friction_coeff=self._tensor(
                (p.damping * draws.damping[:, 6:])[:, to_isaac]))
        robot.write_joint_friction_coefficient_to_sim_index(
            joint_friction_coeff=self._tensor(
                (p.frictionloss * draws.friction[:, 6:])[:, to_isaac]))
        self._kp = p.kp * draws.gain
        robot.write_joint_stiffness_to_sim_index(stiffness=self._tensor(self._kp[:, to_isaac]))
        mu = self._friction_tensor()
        mu[:] = self._torch.as_tensor(self._nominal_mu * draws.contact[:, None], dtype=mu.dtype,
                                      device=mu.device)
        from newton import ModelFlags

        self._sim.physics_manager.add_model_change(ModelFlags.SHAPE_PROPERTIES)
