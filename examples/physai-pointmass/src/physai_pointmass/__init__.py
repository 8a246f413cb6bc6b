"""pointmass-v0: an example physai-flows plugin task, a puck pushed to a target on a table.

Everything a task needs lives in this package: its model file (``pointmass.xml``), observation,
action, reward, success predicate and scripted expert (:mod:`physai_pointmass.env`), and its
scenes (``scenes/``). The entry point in ``pyproject.toml`` (group ``physai_flows.tasks``)
names :func:`register`, which physai-flows calls in every process that resolves a config.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

MODEL_XML = Path(str(files(__name__) / "pointmass.xml"))
"""The MJCF model: table, puck on two slide joints with force motors, target marker, camera."""


def register() -> None:
    """Register pointmass-v0 with physai-flows' task registry."""
    from physai_pointmass import env
    from stages.sim.tasks import TaskSpec, register_task

    register_task(
        TaskSpec(
            name=env.TASK_NAME,
            obs_dim=len(env.OBS_NAMES),
            act_dim=len(env.ACTION_NAMES),
            obs_names=env.OBS_NAMES,
            obs_units=env.OBS_UNITS,
            action_names=env.ACTION_NAMES,
            action_units=env.ACTION_UNITS,
            control_hz=env.CONTROL_HZ,
            target_names=("x", "y", "z"),
            target_units=("m", "m", "m"),
            workspace_low=(-0.4, -0.4, env.PUCK_HEIGHT),
            workspace_high=(0.4, 0.4, env.PUCK_HEIGHT),
            floating_base=False,
            asset_files=(MODEL_XML,),
            camera="top",
            make_env=env.PointMassEnv,
            success_tolerance=env.SUCCESS_TOLERANCE,
        )
    )
