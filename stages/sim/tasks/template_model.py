"""The model of a reach task file, edited into a reach arm, and what is derived from it.

:func:`edited_spec` reads the task file's MJCF model with :class:`mujoco.MjSpec` and edits it
as :mod:`stages.sim.tasks.template` describes: bodies outside the arm removed, the other joints
welded, actuation replaced by a position servo per controlled joint, gravity compensated, a
target marker, an end-effector site and an overview camera added. The home pose
(:func:`home_pose`) and the scripted expert's gains (:func:`expert_gains`) are derived from the
edited model. Nothing is simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from physai_core.errors import ConfigError, Problem
from stages.sim.tasks.template_config import EE_SITE, TARGET_BODY, ReachTemplateConfig

INTEGRATORS: dict[str, mujoco.mjtIntegrator] = {
    "Euler": mujoco.mjtIntegrator.mjINT_EULER,
    "RK4": mujoco.mjtIntegrator.mjINT_RK4,
    "implicit": mujoco.mjtIntegrator.mjINT_IMPLICIT,
    "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
}
"""MuJoCo integrators a task file can name."""

SERVO_FOLLOW = 0.4
"""The derived expert gain is at most this fraction of what the slowest servo can follow:
an expert that moves each servo target by ``g`` of the error per control step closes the loop
at ``g * control_hz`` (1/s) around a servo that settles at ``(kv + damping) / inertia``
(1/s), and the two together oscillate as the first nears the second."""


@dataclass(frozen=True)
class ExpertGains:
    """The expert's gains, as the task file gives them or as derived from the model."""

    gain: float
    """Fraction (per control step) of the end-effector error the expert asks to close."""
    damping: float
    """Damping (m) of the damped-least-squares inverse kinematics."""
    null_gain: float
    """Fraction (per control step) of the distance to the home pose closed in the null space."""


def _add_servos(spec: mujoco.MjSpec, cfg: ReachTemplateConfig,
                joints: list[mujoco.MjsJoint]) -> None:
    """A position servo per controlled joint, with the config's gains and force limit, its
    control range the joint's (none where the joint turns freely)."""
    for joint, kp, kv, limit in zip(joints, _per_joint(cfg.servo.kp, len(joints)),
                                    _per_joint(cfg.servo.kv, len(joints)),
                                    _per_joint(cfg.servo.force_limit, len(joints)),
                                    strict=True):
        servo = spec.add_actuator(name=joint.name, target=joint.name,
                                  trntype=mujoco.mjtTrn.mjTRN_JOINT)
        servo.set_to_position(kp=kp, kv=kv)
        if _has_range(joint):
            servo.ctrlrange = joint.range
            servo.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
        else:
            servo.ctrllimited = mujoco.mjtLimited.mjLIMITED_FALSE
        if limit is not None:
            servo.forcerange = [-limit, limit]
            servo.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE


def edited_spec(
    cfg: ReachTemplateConfig, model_file: Path, task_file: Path
) -> tuple[mujoco.MjSpec, list[Problem]]:
    """The model edited into a reach arm, and every name in ``cfg`` the model lacks.

    1. Read the model file (one that MuJoCo cannot read is a ConfigError on ``model``).
    2. Remove the bodies outside the arm, then look up the controlled joints.
    3. Look up the end effector and the payload body; refuse the template's own names.
    4. With no problem found: weld the other joints, add the servos, the end-effector site,
       the options the task file sets, the target marker and the camera.
    """
    # -- 1. the model file
    file = str(task_file)
    try:
        spec = mujoco.MjSpec.from_file(str(model_file))
    except ValueError as exc:
        raise ConfigError.one(task_file, "model", cfg.model,
                              f"not a loadable MJCF file: {exc}".splitlines()[0]) from None
    # -- 2. the controlled joints, in what remains
    problems: list[Problem] = []
    joint_names = [j.name for j in spec.joints if j.name]
    _remove_foreign_bodies(spec, [j for j in cfg.joints if spec.joint(j) is not None])
    joints = []
    for i, name in enumerate(cfg.joints):
        joint = spec.joint(name)
        if joint is None:
            problems.append(Problem(file, f"joints.{i}", name,
                                    f"no such joint in {model_file.name}; valid: "
                                    f"{', '.join(joint_names) or '(none)'}"))
        elif joint.type != mujoco.mjtJoint.mjJNT_HINGE:
            problems.append(Problem(file, f"joints.{i}", name, "is not a hinge joint"))
        elif name in cfg.joint_ranges:
            joint.range = list(cfg.joint_ranges[name])
            joint.limited = mujoco.mjtLimited.mjLIMITED_TRUE
            joints.append(joint)
        elif joint.limited == mujoco.mjtLimited.mjLIMITED_TRUE and not _has_range(joint):
            problems.append(Problem(file, f"joints.{i}", name,
                                    "is limited in the model but has no range; give one in "
                                    f"joint_ranges.{name}"))
        else:
            joints.append(joint)
    # -- 3. the end effector, the payload body and the template's own names
    problems.extend(_name_problems(spec, cfg, model_file, file))
    ee = cfg.end_effector
    if problems:
        return spec, problems
    # -- 4. the edits
    _keep_arm(spec, [j.name for j in joints])
    _add_servos(spec, cfg, joints)
    if ee.body is not None:
        spec.body(ee.body).add_site(name=EE_SITE, pos=list(ee.offset), size=[0.01, 0, 0],
                                    rgba=[1.0, 0.5, 0.0, 1.0])
    if cfg.timestep is not None:
        spec.option.timestep = cfg.timestep
    spec.option.integrator = INTEGRATORS[cfg.integrator]
    if cfg.gravity is not None:
        spec.option.gravity = list(cfg.gravity)
    _absolute_asset_dirs(spec, model_file)
    low, high = _workspace_box(spec, cfg, task_file)
    marker = spec.worldbody.add_body(name=TARGET_BODY, mocap=True, pos=((low + high) / 2).tolist())
    marker.add_geom(type=mujoco.mjtGeom.mjGEOM_SPHERE,
                    size=[max(cfg.success_distance, 0.01), 0, 0], contype=0,
                    conaffinity=0, group=1, rgba=[0.1, 0.8, 0.2, 0.5])
    if spec.camera(cfg.camera) is None:
        _add_camera(spec, cfg.camera, low, high)
    return spec, problems


def _name_problems(spec: mujoco.MjSpec, cfg: ReachTemplateConfig, model_file: Path,
                   file: str) -> list[Problem]:
    """Names of ``cfg`` that the model (its foreign bodies removed) lacks: the end-effector
    site or body and the payload body; and the template's own names, taken by the model."""
    problems = []
    ee = cfg.end_effector
    if ee.site is not None and spec.site(ee.site) is None:
        sites = ", ".join(s.name for s in spec.sites if s.name) or "(none)"
        problems.append(Problem(file, "end_effector.site", ee.site,
                                f"no such site in {model_file.name} (bodies of uncontrolled "
                                f"joints removed); valid: {sites}"))
    bodies = ", ".join(b.name for b in spec.bodies if b.name and b.name != "world")
    for field, body in (("end_effector.body", ee.body), ("payload_body", cfg.payload_body)):
        if body is not None and spec.body(body) is None:
            problems.append(Problem(file, field, body,
                                    f"no such body in {model_file.name} (bodies of uncontrolled "
                                    f"joints removed); valid: {bodies}"))
    for kind, taken in (("body", spec.body(TARGET_BODY)), ("site", spec.site(EE_SITE))):
        if taken is not None:
            name = TARGET_BODY if kind == "body" else EE_SITE
            problems.append(Problem(file, "model", cfg.model,
                                    f"has a {kind} {name!r}; names starting with physai_ are "
                                    "the template's own: rename it in the model"))
    return problems


def _has_range(joint: mujoco.MjsJoint) -> bool:
    """Whether ``joint`` has a range (low below high) in the model."""
    return bool(joint.range[0] < joint.range[1])


def _remove_foreign_bodies(spec: mujoco.MjSpec, joints: Sequence[str]) -> None:
    """Remove every subtree of the world that has joints, none of them in ``joints``."""
    keep = set(joints)
    for body in list(spec.worldbody.bodies):
        below = body.find_all(mujoco.mjtObj.mjOBJ_JOINT)
        if below and not any(j.name in keep for j in below):
            spec.delete(body)


def _keep_arm(spec: mujoco.MjSpec, joints: Sequence[str]) -> None:
    """Weld every joint but ``joints`` (the bodies of others are gone), drop actuation and
    keyframes, and compensate gravity on every body the joints move."""
    keep = set(joints)
    for joint in list(spec.joints):
        if joint.name not in keep:
            spec.delete(joint)
    for element in (*spec.actuators, *spec.sensors, *spec.tendons, *spec.equalities,
                    *spec.keys):
        spec.delete(element)
    present = {b.name for b in spec.bodies}
    geoms = {g.name for g in spec.geoms}
    for exclude in list(spec.excludes):
        if not {exclude.bodyname1, exclude.bodyname2} <= present:
            spec.delete(exclude)
    for pair in list(spec.pairs):
        if not {pair.geomname1, pair.geomname2} <= geoms:
            spec.delete(pair)
    for name in joints:
        owner = spec.joint(name).parent
        for body in (owner, *owner.find_all(mujoco.mjtObj.mjOBJ_BODY)):
            body.gravcomp = 1.0


def _per_joint(value: float | tuple[float, ...] | None, n: int) -> tuple[float | None, ...]:
    """One value per joint from one value for all or a tuple of ``n``."""
    return value if isinstance(value, tuple) else (value,) * n


def _workspace_box(
    spec: mujoco.MjSpec, cfg: ReachTemplateConfig, task_file: Path
) -> tuple[np.ndarray, np.ndarray]:
    """The workspace's corners (m, world frame) in 3-D: on an axis the workspace has no
    coordinate for, both at the end effector's position in the model's initial pose."""
    model = compiled(spec.copy(), cfg, task_file)
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    rest = data.site(cfg.end_effector.site or EE_SITE).xpos
    low, high = rest.copy(), rest.copy()
    axes = list(cfg.workspace.axis_indices)
    low[axes], high[axes] = cfg.workspace.low, cfg.workspace.high
    return low, high


def _add_camera(spec: mujoco.MjSpec, name: str, low: np.ndarray, high: np.ndarray) -> None:
    """A camera ``name`` in front of, beside and above the box ``low``..``high`` (m, world
    frame), aimed at its centre."""
    centre = (low + high) / 2
    reach = max(float(np.linalg.norm(high - low)), 0.5)
    position = centre + reach * np.array([1.0, -0.85, 0.75])
    forward = (centre - position) / np.linalg.norm(centre - position)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, forward)
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.column_stack([right, up, -forward]).ravel())
    spec.worldbody.add_camera(name=name, pos=position.tolist(), quat=quat.tolist())


def _absolute_asset_dirs(spec: mujoco.MjSpec, model_file: Path) -> None:
    """Point the model's mesh and texture folders at absolute paths, so a copy of its XML
    elsewhere loads the same files."""
    folder = model_file.parent
    spec.meshdir = str((folder / spec.meshdir).resolve())
    spec.texturedir = str((folder / spec.texturedir).resolve())


def loaded_files(spec: mujoco.MjSpec, model_file: Path) -> tuple[Path, ...]:
    """The mesh, height-field and texture files the model loads, in model order."""
    found = []
    for folder, elements in ((spec.meshdir, spec.meshes), (spec.meshdir, spec.hfields),
                             (spec.texturedir, spec.textures)):
        for element in elements:
            if element.file:
                found.append((model_file.parent / folder / element.file).resolve())
    return tuple(dict.fromkeys(found))


def compiled(spec: mujoco.MjSpec, cfg: ReachTemplateConfig, task_file: Path) -> mujoco.MjModel:
    """``spec`` compiled; a model MuJoCo rejects is one ConfigError on ``model``."""
    try:
        return spec.compile()
    except ValueError as exc:
        raise ConfigError.one(task_file, "model", cfg.model,
                              f"does not compile: {exc}".splitlines()[0]) from None


def home_pose(
    cfg: ReachTemplateConfig, model_file: Path, arm: mujoco.MjModel, task_file: Path
) -> tuple[float, ...]:
    """The home pose (rad) per joint: the task file's, the model's keyframe ``home``, or the
    middle of every joint's range in the edited model ``arm`` (a free joint's initial
    position where it has none)."""
    if cfg.home is not None:
        return cfg.home
    original = mujoco.MjSpec.from_file(str(model_file))
    if original.key("home") is not None:
        model = compiled(original, cfg, task_file)
        pose = model.key("home").qpos[[model.jnt_qposadr[model.joint(j).id] for j in cfg.joints]]
    else:
        ids = [arm.joint(j).id for j in cfg.joints]
        ranges = arm.jnt_range[ids]
        pose = np.where(ranges[:, 0] < ranges[:, 1], ranges.mean(axis=1),
                        arm.qpos0[arm.jnt_qposadr[ids]])
    return tuple(float(q) for q in pose)


def expert_gains(
    cfg: ReachTemplateConfig, arm: mujoco.MjModel, home: Sequence[float]
) -> ExpertGains:
    """The expert's gains: the task file's, and those it leaves out derived from the edited
    model ``arm`` at the home pose (see
    :class:`~stages.sim.tasks.template_config.ExpertConfig`)."""
    given = cfg.expert
    data = mujoco.MjData(arm)
    ids = [arm.joint(j).id for j in cfg.joints]
    data.qpos[arm.jnt_qposadr[ids]] = home
    mujoco.mj_forward(arm, data)
    inertia = np.zeros((arm.nv, arm.nv))
    mujoco.mj_fullM(arm, data, inertia)
    dofs = arm.jnt_dofadr[ids]
    kv = np.array(_per_joint(cfg.servo.kv, len(ids)), dtype=np.float64)
    settle = (kv + arm.dof_damping[dofs]) / np.diag(inertia)[dofs]
    gain = min(0.2, SERVO_FOLLOW * float(settle.min()) / cfg.control_hz)
    ee = data.site(cfg.end_effector.site or EE_SITE).xpos
    reach = float(np.linalg.norm(data.xanchor[ids] - ee, axis=1).max())
    redundant = len(cfg.joints) > len(cfg.workspace.axis_names)
    return ExpertGains(
        gain=given.gain if given.gain is not None else gain,
        damping=given.damping if given.damping is not None else min(0.05, reach / 10),
        null_gain=(given.null_gain if given.null_gain is not None
                   else (0.1 if redundant else 0.0)),
    )


def ancestors(model: mujoco.MjModel, body: int) -> list[int]:
    """``body`` and every body above it, up to (not including) the world."""
    chain = []
    while body > 0:
        chain.append(body)
        body = int(model.body_parentid[body])
    return chain
