"""Task templates: a reach task of any arm model, from a task file and no Python.

A task file (YAML, ``template: reach``) names an MJCF model (a path relative to the task
file, or ``pkg:PACKAGE/PATH`` inside an installed package), the joints to control, the end
effector, the workspace and the control rate
(:class:`~stages.sim.tasks.template_config.ReachTemplateConfig`). The model is loaded with
:class:`mujoco.MjSpec` and edited into a reach arm (:mod:`stages.sim.tasks.template_model`):

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
- a mocap body ``physai_target`` (the target marker), a site ``physai_end_effector`` on the
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
from typing import TYPE_CHECKING

import mujoco

from physai_core.errors import ConfigError, Problem
from stages.core.loading import load_model
from stages.core.resources import resolve_file
from stages.sim.tasks.catalog import TaskSpec, register_task, task_names
from stages.sim.tasks.reach_arm import (
    ReachArm,
    ReachArmEnv,
    reach_action_names,
    reach_obs_names,
    reach_obs_units,
    reach_success_tolerance,
)
from stages.sim.tasks.template_config import EE_SITE, TARGET_BODY, ReachTemplateConfig
from stages.sim.tasks.template_model import (
    ExpertGains,
    ancestors,
    compiled,
    edited_spec,
    expert_gains,
    home_pose,
    loaded_files,
)

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene


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
        spec, problems = edited_spec(self.config, self.model_file, self.task_file)
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
    """Read and check a task file and its model; nothing is registered or simulated.

    1. Read the task file; a per-joint list must have one entry per joint.
    2. Find the model file and edit it (:func:`~stages.sim.tasks.template_model.edited_spec`);
       the control rate must be a whole number of physics steps.
    3. Compile the edited model; every controlled joint must move the end effector.
    4. Derive the home pose, the asset files, the payload body and the expert's gains.
    """
    # -- 1. the task file
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
    # -- 2. the model, edited; the control rate
    try:
        model_file = resolve_file(cfg.model, path.parent)
    except ValueError as exc:
        raise ConfigError.one(path, "model", cfg.model, str(exc)) from None
    if not model_file.is_file():
        raise ConfigError.one(path, "model", cfg.model, f"model file not found: {model_file}")
    spec, problems = edited_spec(cfg, model_file, path)
    timestep = cfg.timestep or spec.option.timestep
    steps = 1.0 / (cfg.control_hz * timestep)
    frame_skip = round(steps)
    if frame_skip < 1 or abs(frame_skip * timestep * cfg.control_hz - 1.0) > 1e-9:
        problems.append(Problem(str(path), "control_hz", cfg.control_hz,
                                f"1 / (control_hz * timestep {timestep:g} s) = {steps:g} "
                                "physics steps per control step, not a whole number"))
    if problems:
        raise ConfigError(problems)
    # -- 3. the compiled arm moves its end effector by every controlled joint
    model = compiled(spec, cfg, path)
    ee_body = int(model.site_bodyid[model.site(cfg.end_effector.site or EE_SITE).id])
    if model.body_dofnum[ancestors(model, ee_body)].sum() != len(cfg.joints):
        field = "end_effector.site" if cfg.end_effector.site else "end_effector.body"
        raise ConfigError.one(path, field, cfg.end_effector.site or cfg.end_effector.body,
                              "is not moved by every controlled joint")
    # -- 4. what is derived from the arm
    home = home_pose(cfg, model_file, model, path)
    return ReachTemplate(
        task_file=path,
        config=cfg,
        model_file=model_file,
        asset_files=(path, model_file, *loaded_files(spec, model_file)),
        frame_skip=frame_skip,
        home=home,
        payload_body=cfg.payload_body or model.body(ee_body).name,
        expert=expert_gains(cfg, model, home),
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
