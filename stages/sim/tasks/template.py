"""Task templates: a reach task of any arm model, from a task file and no Python.

A task file (YAML, ``template: reach``) names an MJCF model (a path relative to the task
file, or ``pkg:PACKAGE/PATH`` inside an installed package), the joints to control, the end
effector, the workspace and the control rate (:class:`ReachTemplateConfig`). The model is
loaded with :class:`mujoco.MjSpec` and edited into a reach arm:

- bodies outside the arm (subtrees of the world with joints, none of them controlled: the
  object and goal of Gymnasium's pusher, the target of its reacher) are removed first, so the
  names the task file gives are looked up in what remains, and every other joint is welded, so
  only the controlled joints' kinematics remain;
- actuators, sensors, tendons, equality constraints and keyframes are dropped, and every
  controlled joint gets a position servo (``kp``, ``kv``) over its range: the task file's
  (``joint_ranges``), else the model's; a hinge with neither turns freely and its servo target
  is unbounded;
- every body the joints move gets ``gravcomp="1"``: the robot's controller compensates gravity
  with the nominal masses, as reach-v0's arm does, so a randomized payload sags;
- a mocap body :data:`TARGET_BODY` (the target marker), a site :data:`EE_SITE` on the
  end-effector body when the task file names a body, and an overview camera aimed at the
  workspace (when the model has no camera of the task file's ``camera`` name) are added; the
  template's own names start with ``physai_``, which the model's may not;
- the timestep, integrator and gravity are set when the task file says so, and
  timestep * frame_skip must make exactly one control step at ``control_hz``.

The workspace, and every scene's target box, has one, two or three coordinates: x, y and z of
the world frame, or the axes ``workspace.axes`` names (a planar arm's workspace is
``[x, y]``). Success and the expert measure the distance over those axes only.

The environment is :class:`TemplateReachEnv` (observation, action, reward, success and the
damped-least-squares expert of :mod:`stages.sim.tasks.reach_arm`). :func:`register_task_file` checks
the file, parses the model (nothing is simulated) and registers the task under the file's
``name``; pipeline configs name task files in ``tasks``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import mujoco
import numpy as np
from pydantic import (
    ConfigDict,
    Field,
    PositiveFloat,
    ValidationInfo,
    field_validator,
    model_validator,
)

from physai_core.errors import ConfigError, Problem
from stages.core.loading import load_model
from stages.core.resources import resolve_file
from stages.core.schema import DocumentedModel
from stages.sim.tasks.catalog import TaskSpec, Vec3, register_task, task_names
from stages.sim.tasks.reach_arm import (
    ReachArm,
    ReachArmEnv,
    reach_action_names,
    reach_obs_names,
    reach_obs_units,
    reach_success_tolerance,
)

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene

TARGET_BODY = "physai_target"
"""Name of the mocap body the template adds to mark the target."""

EE_SITE = "physai_end_effector"
"""Name of the site the template adds on the end-effector body when the task file names a
body."""

AXES = ("x", "y", "z")
"""The world axes a workspace's coordinates can be on, in their default order."""

INTEGRATORS: dict[str, mujoco.mjtIntegrator] = {
    "Euler": mujoco.mjtIntegrator.mjINT_EULER,
    "RK4": mujoco.mjtIntegrator.mjINT_RK4,
    "implicit": mujoco.mjtIntegrator.mjINT_IMPLICIT,
    "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
}
"""MuJoCo integrators a task file can name."""


class _TemplateModel(DocumentedModel):
    """Base of the task-file models: documented attributes, no NaN or infinity."""

    model_config = ConfigDict(allow_inf_nan=False)


class EndEffectorConfig(_TemplateModel):
    """The point of the arm that reaches: a site of the model, or a point on one of its bodies.

    Exactly one of ``site`` and ``body`` is given.
    """

    site: str | None = None
    """Name of a model site whose position is the end effector."""
    body: str | None = None
    """Name of a model body; the end effector is ``offset`` in that body's frame."""
    offset: Vec3 = (0.0, 0.0, 0.0)
    """Position (m, body frame) of the end effector on ``body``; only with ``body``."""

    @model_validator(mode="after")
    def _site_or_body(self) -> EndEffectorConfig:
        if (self.site is None) == (self.body is None):
            raise ValueError("give exactly one of site and body")
        if self.site is not None and self.offset != (0.0, 0.0, 0.0):
            raise ValueError("offset applies to a body, not to a site")
        return self


class WorkspaceConfig(_TemplateModel):
    """The box (m, world frame) of targets the scripted expert reaches; every scene's target
    box must lie inside it. One, two or three coordinates: a planar arm's is 2-D."""

    low: tuple[float, ...] = Field(min_length=1, max_length=3)
    """Lower corner (m, world frame), one coordinate per axis of ``axes``."""
    high: tuple[float, ...] = Field(min_length=1, max_length=3)
    """Upper corner (m, world frame), one coordinate per axis of ``axes``."""
    axes: tuple[Literal["x", "y", "z"], ...] | None = None
    """The world axes of the corners' coordinates, in order; None: x, y and z, as many as
    ``low`` has (``[x, y]`` for two)."""

    @model_validator(mode="after")
    def _ordered(self) -> WorkspaceConfig:
        if len(self.low) != len(self.high):
            raise ValueError(f"low has {len(self.low)} coordinates, high {len(self.high)}")
        if self.axes is not None and (len(self.axes) != len(self.low)
                                      or len(set(self.axes)) != len(self.axes)):
            raise ValueError(f"axes must name {len(self.low)} distinct axes, one per "
                             "coordinate of low and high")
        if any(lo > hi for lo, hi in zip(self.low, self.high, strict=True)):
            raise ValueError("low exceeds high")
        return self

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The world axes of the coordinates, in order (``axes`` or its default)."""
        return self.axes if self.axes is not None else AXES[: len(self.low)]

    @property
    def axis_indices(self) -> tuple[int, ...]:
        """The world axes of the coordinates as indices (0 x, 1 y, 2 z), in order."""
        return tuple(AXES.index(a) for a in self.axis_names)


class ServoConfig(_TemplateModel):
    """The position servo on every controlled joint: ``torque = kp (target - q) - kv qdot``.

    Each gain is one number for every joint or one number per joint, in ``joints`` order.
    """

    kp: PositiveFloat | tuple[PositiveFloat, ...] = 100.0
    """Stiffness (N m/rad)."""
    kv: PositiveFloat | tuple[PositiveFloat, ...] = 10.0
    """Damping (N m s/rad)."""
    force_limit: PositiveFloat | tuple[PositiveFloat, ...] | None = None
    """Largest torque magnitude (N m) a servo applies; None: unlimited."""


class ExpertConfig(_TemplateModel):
    """Gains of the scripted damped-least-squares expert (see :mod:`stages.sim.tasks.reach_arm`).

    A gain left out is derived from the edited model at its home pose (:class:`ExpertGains`),
    so an arm of any size and inertia gets an expert that reaches; a number given is used as
    it is.
    """

    gain: float | None = Field(None, gt=0, le=1)
    """Fraction (per control step) of the end-effector error the expert asks to close; None:
    0.2, or less where the servos cannot follow that (:data:`SERVO_FOLLOW`)."""
    damping: PositiveFloat | None = None
    """Damping (m) of the damped-least-squares inverse kinematics; None: a tenth of the arm's
    reach at the home pose, at most 0.05 m."""
    null_gain: float | None = Field(None, ge=0, le=1)
    """Fraction (per control step) of the distance to the home pose closed in the null space;
    None: 0.1 for an arm with more joints than the workspace has axes, else 0 (no null space
    to use: a pull toward home would only fight the reach)."""


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


class ReachTemplateConfig(_TemplateModel):
    """A task file of the reach template: any arm model, made a reach task from config alone."""

    template: Literal["reach"]
    """Which template the file instantiates."""
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*(-[a-z0-9_]+)*-v[0-9]+$")
    """Versioned task id, e.g. ``pusher-reach-v0``; a change to the file bumps the version."""
    model: str = Field(min_length=1)
    """The MJCF file: a path relative to this task file, or ``pkg:PACKAGE/PATH``."""
    end_effector: EndEffectorConfig
    """The point that reaches: ``{site: NAME}`` or ``{body: NAME, offset: [x, y, z]}``."""
    joints: tuple[str, ...] = Field(min_length=1)
    """Controlled hinge joints, in observation and action order; every other joint is welded."""
    joint_ranges: dict[str, tuple[float, float]] = Field(default_factory=dict)
    """Range (rad) of controlled joints, by name: the joint's limit and its servo's control
    range, replacing the model's. A joint with no range here or in the model turns freely."""
    workspace: WorkspaceConfig
    """The box (m, world frame) of targets the scripted expert reaches."""
    control_hz: PositiveFloat
    """Control rate (Hz); 1 / (control_hz * timestep) must be a whole number of physics steps."""
    timestep: PositiveFloat | None = None
    """Physics timestep (s); None: the model's."""
    integrator: Literal["Euler", "RK4", "implicit", "implicitfast"] = "implicitfast"
    """MuJoCo integrator; ``implicitfast`` integrates the servos' damping implicitly."""
    gravity: Vec3 | None = None
    """Gravity (m/s^2, world frame); None: the model's."""
    servo: ServoConfig = Field(default_factory=lambda: ServoConfig())
    """The position servos' gains and torque limits."""
    action_scale: PositiveFloat = 0.1
    """Servo-target change (rad) per control step for an action of 1.0."""
    success_distance: PositiveFloat
    """Success tolerance (m) on the end-effector-to-target distance."""
    home: tuple[float, ...] | None = None
    """Home pose (rad) per joint, in ``joints`` order; None: the model's keyframe ``home``
    if it has one, else the middle of every joint's range."""
    home_noise: float = Field(0.1, ge=0)
    """Half-width (rad) of the uniform noise added to every joint of the home pose at reset."""
    expert: ExpertConfig = Field(default_factory=lambda: ExpertConfig())
    """Gains of the scripted expert."""
    payload_body: str | None = None
    """Body that a scene's payload mass is added to; None: the end effector's body."""
    camera: str = "overview"
    """Model camera that rollout videos are rendered from; added, aimed at the workspace, when
    the model has no camera of that name."""

    @field_validator("joints")
    @classmethod
    def _distinct(cls, joints: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(joints)) != len(joints):
            raise ValueError("a joint is listed more than once")
        return joints

    @field_validator("joint_ranges")
    @classmethod
    def _ranges_of_controlled_joints(
        cls, ranges: dict[str, tuple[float, float]], info: ValidationInfo
    ) -> dict[str, tuple[float, float]]:
        joints = info.data.get("joints", ())
        for name, (low, high) in ranges.items():
            if name not in joints:
                raise ValueError(f"{name!r} is not in joints")
            if not low < high:
                raise ValueError(f"{name}: low {low:g} is not below high {high:g}")
        return ranges


@dataclass(frozen=True)
class ReachTemplate:
    """A checked task file: its config, its model file and what was derived from them."""

    task_file: Path
    """The task file (resolved)."""
    config: ReachTemplateConfig
    """The task file's contents."""
    model_file: Path
    """The MJCF file the task file names (resolved)."""
    asset_files: tuple[Path, ...]
    """The task file, the model file and the mesh and texture files the model loads."""
    frame_skip: int
    """Physics steps per control step."""
    home: tuple[float, ...]
    """Home pose (rad) per joint, in ``joints`` order."""
    payload_body: str
    """Body that a scene's payload mass is added to."""
    expert: ExpertGains
    """The scripted expert's gains (the task file's, or derived from the model)."""

    @property
    def arm(self) -> ReachArm:
        """How the environment drives the edited model."""
        cfg = self.config
        return ReachArm(
            joints=cfg.joints,
            end_effector_site=cfg.end_effector.site or EE_SITE,
            target_body=TARGET_BODY,
            home=self.home,
            action_scale=cfg.action_scale,
            success_distance=cfg.success_distance,
            home_noise=cfg.home_noise,
            expert_gain=self.expert.gain,
            expert_damping=self.expert.damping,
            expert_null_gain=self.expert.null_gain,
            target_axes=cfg.workspace.axis_indices,
        )

    def edited_spec(self) -> mujoco.MjSpec:
        """The model, edited into a reach arm (see the module docstring)."""
        spec, problems = _edited_spec(self.config, self.model_file, self.task_file)
        if problems:
            raise ConfigError(problems)
        return spec

    def make_env(
        self, scene: Scene, num_worlds: int, seed: int, *, num_threads: int | None = None
    ) -> TemplateReachEnv:
        """The batched environment of this task: ``num_worlds`` worlds of ``scene``, seeded."""
        return TemplateReachEnv(self, scene, num_worlds, seed, num_threads=num_threads)


class TemplateReachEnv(ReachArmEnv):
    """N worlds of a reach task made from a task file (see :mod:`stages.sim.tasks.reach_arm`).

    Observation (2 n + 3 + 2 k, k the workspace's axes): joint positions (n, rad), joint
    velocities (n, rad/s), end-effector position (3, m), target (k, m), target minus end
    effector (k, m). Action (n, in [-1, 1]): change of each servo target, 1.0 =
    ``action_scale`` rad per control step. Reward: minus the distance (m) over the workspace's
    axes. Success: that distance below ``success_distance`` (m).
    """

    def __init__(
        self,
        template: ReachTemplate,
        scene: Scene,
        num_worlds: int,
        seed: int,
        *,
        num_threads: int | None = None,
    ) -> None:
        """Edit the task's model and build ``num_worlds`` worlds of ``scene``; call reset() next.

        ``num_threads`` C threads step the worlds (default: every CPU).
        """
        xml = template.edited_spec().to_xml()
        with tempfile.TemporaryDirectory(prefix="physai-template-") as folder:
            model_path = Path(folder) / template.model_file.name
            model_path.write_text(xml, encoding="utf-8")
            super().__init__(
                scene,
                num_worlds,
                seed,
                task_name=template.config.name,
                model_path=model_path,
                frame_skip=template.frame_skip,
                control_hz=template.config.control_hz,
                payload_body=template.payload_body,
                arm=template.arm,
                num_threads=num_threads,
            )


_BY_FILE: dict[Path, TaskSpec] = {}
"""Tasks registered from task files in this process, by resolved task file."""

_TEMPLATE_OF: dict[str, ReachTemplate] = {}
"""The checked task file each task id of :data:`_BY_FILE` came from."""


def register_task_file(path: Path) -> TaskSpec:
    """Check the task file ``path`` and its model, register its task and return the spec.

    Registering the same file again in one process returns the first spec. Raises one
    :class:`~physai_core.errors.ConfigError` naming file, field and value for a bad file, a model
    that lacks a named joint, site or body, a control rate the timestep cannot make, or an id
    that another file or a shipped task already holds.
    """
    path = Path(path).resolve()
    if path in _BY_FILE:
        return _BY_FILE[path]
    template = load_template(path)
    name = template.config.name
    if name in _TEMPLATE_OF or name in task_names():
        owner = _TEMPLATE_OF.get(name)
        holder = f"task file {owner.task_file}" if owner else "a shipped or plugin task"
        raise ConfigError.one(path, "name", name, f"task id already registered by {holder}")
    spec = register_task(task_spec(template))
    _BY_FILE[path] = spec
    _TEMPLATE_OF[name] = template
    return spec


def registered_template(name: str) -> ReachTemplate | None:
    """The checked task file that registered the task ``name`` in this process; None for a
    task no task file made."""
    return _TEMPLATE_OF.get(name)


def register_task_refs(refs: Sequence[str], config_file: Path) -> tuple[TaskSpec, ...]:
    """Register the task files a pipeline config names in ``tasks`` (paths relative to
    ``config_file``, or ``pkg:`` references); every problem raises one ConfigError."""
    problems: list[Problem] = []
    specs = []
    for i, ref in enumerate(refs):
        field = f"tasks.{i}"
        try:
            task_file = resolve_file(ref, config_file.parent)
        except ValueError as exc:
            problems.append(Problem(str(config_file), field, ref, str(exc)))
            continue
        if not task_file.is_file():
            problems.append(Problem(str(config_file), field, ref,
                                    f"task file not found: {task_file}"))
            continue
        try:
            specs.append(register_task_file(task_file))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return tuple(specs)


def load_template(path: Path) -> ReachTemplate:
    """Read and check a task file and its model; nothing is registered or simulated."""
    path = Path(path).resolve()
    cfg = load_model(ReachTemplateConfig, path)
    n = len(cfg.joints)
    per_joint = (("home", cfg.home), ("servo.kp", cfg.servo.kp), ("servo.kv", cfg.servo.kv),
                 ("servo.force_limit", cfg.servo.force_limit))
    lengths = [Problem(str(path), field, value,
                       f"has {len(value)} entries, not one per joint ({n})")
               for field, value in per_joint if isinstance(value, tuple) and len(value) != n]
    if lengths:
        raise ConfigError(lengths)
    try:
        model_file = resolve_file(cfg.model, path.parent)
    except ValueError as exc:
        raise ConfigError.one(path, "model", cfg.model, str(exc)) from None
    if not model_file.is_file():
        raise ConfigError.one(path, "model", cfg.model, f"model file not found: {model_file}")
    spec, problems = _edited_spec(cfg, model_file, path)
    timestep = cfg.timestep or spec.option.timestep
    steps = 1.0 / (cfg.control_hz * timestep)
    frame_skip = round(steps)
    if frame_skip < 1 or abs(frame_skip * timestep * cfg.control_hz - 1.0) > 1e-9:
        problems.append(Problem(str(path), "control_hz", cfg.control_hz,
                                f"1 / (control_hz * timestep {timestep:g} s) = {steps:g} "
                                "physics steps per control step, not a whole number"))
    if problems:
        raise ConfigError(problems)
    model = _compiled(spec, cfg, path)
    ee_body = int(model.site_bodyid[model.site(cfg.end_effector.site or EE_SITE).id])
    if model.body_dofnum[_ancestors(model, ee_body)].sum() != len(cfg.joints):
        field = "end_effector.site" if cfg.end_effector.site else "end_effector.body"
        raise ConfigError.one(path, field, cfg.end_effector.site or cfg.end_effector.body,
                              "is not moved by every controlled joint")
    home = _home(cfg, model_file, model, path)
    return ReachTemplate(
        task_file=path,
        config=cfg,
        model_file=model_file,
        asset_files=(path, model_file, *_loaded_files(spec, model_file)),
        frame_skip=frame_skip,
        home=home,
        payload_body=cfg.payload_body or model.body(ee_body).name,
        expert=_expert_gains(cfg, model, home),
    )


def task_spec(template: ReachTemplate) -> TaskSpec:
    """The registry entry of a checked task file."""
    cfg = template.config
    n, axes = len(cfg.joints), cfg.workspace.axis_names
    return TaskSpec(
        name=cfg.name,
        obs_dim=2 * n + 3 + 2 * len(axes),
        act_dim=n,
        obs_names=reach_obs_names(cfg.joints, axes),
        obs_units=reach_obs_units(n, len(axes)),
        action_names=reach_action_names(cfg.joints),
        action_units=(f"{cfg.action_scale:g} rad",) * n,
        control_hz=cfg.control_hz,
        target_names=axes,
        target_units=("m",) * len(axes),
        workspace_low=cfg.workspace.low,
        workspace_high=cfg.workspace.high,
        floating_base=False,
        asset_files=template.asset_files,
        camera=cfg.camera,
        make_env=template.make_env,
        success_tolerance=reach_success_tolerance(cfg.success_distance),
    )


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


def _edited_spec(
    cfg: ReachTemplateConfig, model_file: Path, task_file: Path
) -> tuple[mujoco.MjSpec, list[Problem]]:
    """The model edited into a reach arm, and every name in ``cfg`` the model lacks."""
    file = str(task_file)
    try:
        spec = mujoco.MjSpec.from_file(str(model_file))
    except ValueError as exc:
        raise ConfigError.one(task_file, "model", cfg.model,
                              f"not a loadable MJCF file: {exc}".splitlines()[0]) from None
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
    if problems:
        return spec, problems
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
    model = _compiled(spec.copy(), cfg, task_file)
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


def _loaded_files(spec: mujoco.MjSpec, model_file: Path) -> tuple[Path, ...]:
    """The mesh, height-field and texture files the model loads, in model order."""
    found = []
    for folder, elements in ((spec.meshdir, spec.meshes), (spec.meshdir, spec.hfields),
                             (spec.texturedir, spec.textures)):
        for element in elements:
            if element.file:
                found.append((model_file.parent / folder / element.file).resolve())
    return tuple(dict.fromkeys(found))


def _compiled(spec: mujoco.MjSpec, cfg: ReachTemplateConfig, task_file: Path) -> mujoco.MjModel:
    """``spec`` compiled; a model MuJoCo rejects is one ConfigError on ``model``."""
    try:
        return spec.compile()
    except ValueError as exc:
        raise ConfigError.one(task_file, "model", cfg.model,
                              f"does not compile: {exc}".splitlines()[0]) from None


def _home(
    cfg: ReachTemplateConfig, model_file: Path, arm: mujoco.MjModel, task_file: Path
) -> tuple[float, ...]:
    """The home pose (rad) per joint: the task file's, the model's keyframe ``home``, or the
    middle of every joint's range in the edited model ``arm`` (a free joint's initial
    position where it has none)."""
    if cfg.home is not None:
        return cfg.home
    original = mujoco.MjSpec.from_file(str(model_file))
    if original.key("home") is not None:
        model = _compiled(original, cfg, task_file)
        pose = model.key("home").qpos[[model.jnt_qposadr[model.joint(j).id] for j in cfg.joints]]
    else:
        ids = [arm.joint(j).id for j in cfg.joints]
        ranges = arm.jnt_range[ids]
        pose = np.where(ranges[:, 0] < ranges[:, 1], ranges.mean(axis=1),
                        arm.qpos0[arm.jnt_qposadr[ids]])
    return tuple(float(q) for q in pose)


def _expert_gains(
    cfg: ReachTemplateConfig, arm: mujoco.MjModel, home: Sequence[float]
) -> ExpertGains:
    """The expert's gains: the task file's, and those it leaves out derived from the edited
    model ``arm`` at the home pose (see :class:`ExpertConfig`)."""
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


def _ancestors(model: mujoco.MjModel, body: int) -> list[int]:
    """``body`` and every body above it, up to (not including) the world."""
    chain = []
    while body > 0:
        chain.append(body)
        body = int(model.body_parentid[body])
    return chain
