"""The tasks this project ships: reach-v0 (a 7-DOF arm), reach-vision-v0 (the arm, the target
seen by a camera), locomotion-v0 (a quadruped), lift-v0, pick-place-v0 and pick-place-vision-v0
(the arm with a gripper, :mod:`stages.sim.tasks.manipulation`), the
``gymnasium:<EnvId>`` family (every environment registered with Gymnasium) and the
``isaaclab:<gym id>`` family (Isaac Lab's registered tasks, in the isaaclab stage environment).

Imported by :func:`stages.sim.tasks.catalog.get_task` on the first lookup, not when the registry
module is imported, so reading a config does not load the task modules until a task is asked for.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace

from stages.sim.backends import gymnasium_tasks as gym_task
from stages.sim.backends import isaaclab_family
from stages.sim.tasks import locomotion, manipulation, reach, reach_vision
from stages.sim.tasks.catalog import EnvFactory, TaskSpec, register_task, register_task_family


def _module_task(module: ModuleType | SimpleNamespace, make_env: EnvFactory, model_file: Path,
                 camera: str, floating_base: bool,
                 asset_files: tuple[Path, ...] = ()) -> TaskSpec:
    """The task ``module`` declares in its ``TASK_NAME``, ``OBS_NAMES``, ``OBS_UNITS``,
    ``ACTION_NAMES``, ``ACTION_UNITS``, ``CONTROL_HZ``, ``TARGET_NAMES``, ``TARGET_UNITS``,
    ``WORKSPACE_LOW``, ``WORKSPACE_HIGH``, ``SUCCESS_TOLERANCE`` and, for a task that sees,
    ``CAMERAS``; one action per entry of ``ACTION_NAMES``. ``asset_files`` are more model files
    the model includes."""
    return TaskSpec(
        name=module.TASK_NAME,
        obs_dim=len(module.OBS_NAMES),
        act_dim=len(module.ACTION_NAMES),
        obs_names=module.OBS_NAMES,
        obs_units=module.OBS_UNITS,
        action_names=module.ACTION_NAMES,
        action_units=module.ACTION_UNITS,
        control_hz=module.CONTROL_HZ,
        target_names=module.TARGET_NAMES,
        target_units=module.TARGET_UNITS,
        workspace_low=module.WORKSPACE_LOW,
        workspace_high=module.WORKSPACE_HIGH,
        floating_base=floating_base,
        asset_files=(model_file, *asset_files),
        camera=camera,
        make_env=make_env,
        success_tolerance=module.SUCCESS_TOLERANCE,
        cameras=getattr(module, "CAMERAS", ()),
    )


def _manipulation_task(name: str, make_env: EnvFactory, success: str,
                       sees: bool = False) -> TaskSpec:
    """A task of :mod:`stages.sim.tasks.manipulation`, declared as :func:`_module_task` reads
    a module: its id and success predicate, and for a task that sees only the robot's own
    state beside its cameras."""
    m = manipulation
    declared = SimpleNamespace(
        **{k: getattr(m, k) for k in ("ACTION_NAMES", "ACTION_UNITS", "CONTROL_HZ",
                                      "TARGET_NAMES", "TARGET_UNITS", "WORKSPACE_LOW",
                                      "WORKSPACE_HIGH")},
        TASK_NAME=name, SUCCESS_TOLERANCE=success,
        OBS_NAMES=m.STATE_NAMES if sees else m.OBS_NAMES,
        OBS_UNITS=m.STATE_UNITS if sees else m.OBS_UNITS,
        CAMERAS=m.CAMERAS if sees else ())
    spec = _module_task(declared, make_env, m.GRIPPER_XML, "front", floating_base=False)
    return replace(spec, grasps_objects=True)


def register() -> None:
    """Register reach-v0, reach-vision-v0, locomotion-v0, lift-v0, pick-place-v0,
    pick-place-vision-v0 and the gymnasium and isaaclab task families."""
    register_task(_module_task(reach, reach.ReachEnv, reach.ARM7_XML, "overview",
                               floating_base=False))
    register_task(_module_task(reach_vision, reach_vision.ReachVisionEnv,
                               reach_vision.ARM7_VISION_XML, "front", floating_base=False))
    register_task(_module_task(locomotion, locomotion.LocomotionEnv, locomotion.QUADRUPED_XML,
                               "track", floating_base=True))
    m = manipulation
    register_task(_manipulation_task("lift-v0", m.lift_env, m.LIFT_SUCCESS))
    register_task(_manipulation_task("pick-place-v0", m.pick_place_env, m.PLACE_SUCCESS))
    register_task(_manipulation_task("pick-place-vision-v0", m.pick_place_vision_env,
                                     m.PLACE_SUCCESS, sees=True))
    register_task_family(gym_task.PREFIX, gym_task.make_task)
    register_task_family(isaaclab_family.PREFIX, isaaclab_family.make_task)
