"""The tasks this project ships: reach-v0 (a 7-DOF arm), locomotion-v0 (a quadruped), the
``gymnasium:<EnvId>`` family (every environment registered with Gymnasium) and the
``isaaclab:<gym id>`` family (Isaac Lab's registered tasks, in the isaaclab stage environment).

Imported by :func:`stages.sim.tasks.get_task` on the first lookup, not when the registry module
is imported, so reading a config does not load the task modules until a task is asked for.
"""

from __future__ import annotations

from stages.sim import gym_task, isaaclab_family, locomotion, reach
from stages.sim.tasks import TaskSpec, register_task, register_task_family


def register() -> None:
    """Register reach-v0, locomotion-v0 and the gymnasium and isaaclab task families."""
    register_task(
        TaskSpec(
            name=reach.TASK_NAME,
            obs_dim=len(reach.OBS_NAMES),
            act_dim=len(reach.ACTION_NAMES),
            obs_names=reach.OBS_NAMES,
            obs_units=reach.OBS_UNITS,
            action_names=reach.ACTION_NAMES,
            action_units=reach.ACTION_UNITS,
            control_hz=reach.CONTROL_HZ,
            target_names=reach.TARGET_NAMES,
            target_units=reach.TARGET_UNITS,
            workspace_low=reach.WORKSPACE_LOW,
            workspace_high=reach.WORKSPACE_HIGH,
            floating_base=False,
            asset_files=(reach.ARM7_XML,),
            camera="overview",
            make_env=reach.ReachEnv,
            success_tolerance=reach.SUCCESS_TOLERANCE,
        )
    )
    register_task(
        TaskSpec(
            name=locomotion.TASK_NAME,
            obs_dim=len(locomotion.OBS_NAMES),
            act_dim=locomotion.NUM_JOINTS,
            obs_names=locomotion.OBS_NAMES,
            obs_units=locomotion.OBS_UNITS,
            action_names=locomotion.ACTION_NAMES,
            action_units=locomotion.ACTION_UNITS,
            control_hz=locomotion.CONTROL_HZ,
            target_names=locomotion.TARGET_NAMES,
            target_units=locomotion.TARGET_UNITS,
            workspace_low=locomotion.WORKSPACE_LOW,
            workspace_high=locomotion.WORKSPACE_HIGH,
            asset_files=(locomotion.QUADRUPED_XML,),
            camera="track",
            make_env=locomotion.LocomotionEnv,
            success_tolerance=locomotion.SUCCESS_TOLERANCE,
            floating_base=True,
        )
    )
    register_task_family(gym_task.PREFIX, gym_task.make_task)
    register_task_family(isaaclab_family.PREFIX, isaaclab_family.make_task)
