"""The task registry: one registration point for every simulated task.

A task is a robot model plus its observation, action, reward, success predicate and scripted
expert. Tasks are registered under versioned ids (``reach-v0``); a change to any of those bumps
the version. Registering fills a dict only: no model is loaded until ``make_env`` is called.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stages.errors import DuplicateNameError, UnknownNameError
from stages.sim import reach
from stages.sim.batched import BatchedEnv

if TYPE_CHECKING:
    from stages.sim.scene import Scene

Vec3 = tuple[float, float, float]
"""A point or box corner (x, y, z) in metres, world frame."""

_TASK_ID = re.compile(r"^[a-z][a-z0-9_]*(-[a-z0-9_]+)*-v[0-9]+$")


@dataclass(frozen=True)
class TaskSpec:
    """Everything the pipeline needs to know about a task, and the factory of its environment."""

    name: str
    """Versioned task id, e.g. ``reach-v0``."""
    obs_dim: int
    """Length of one observation vector."""
    act_dim: int
    """Length of one action vector."""
    obs_names: tuple[str, ...]
    """Name of every observation entry, in order. Length: obs_dim."""
    obs_units: tuple[str, ...]
    """Unit of every observation entry, in order. Length: obs_dim."""
    action_names: tuple[str, ...]
    """Name of every action entry, in order. Length: act_dim."""
    action_units: tuple[str, ...]
    """Unit of every action entry (what an action of 1.0 means), in order. Length: act_dim."""
    control_hz: float
    """Control rate (Hz): one ``step`` call advances the simulation by 1 / control_hz seconds."""
    workspace_low: Vec3
    """Lower corner (m) of the box that every scene's target box must lie in."""
    workspace_high: Vec3
    """Upper corner (m) of the box that every scene's target box must lie in."""
    asset_files: tuple[Path, ...]
    """Model files (MJCF, meshes) the environment loads; their bytes enter every suite digest."""
    make_env: Callable[[Scene, int, int], BatchedEnv]
    """Factory ``make_env(scene, num_worlds, seed)`` of the batched environment."""
    success_tolerance: str
    """The success predicate in words, with its tolerance and unit."""

    def __post_init__(self) -> None:
        """Reject a spec whose id is not versioned or whose names and units do not match dims."""
        if not _TASK_ID.match(self.name):
            raise ValueError(f"task id {self.name!r} is not a versioned id like 'reach-v0'")
        for what, items, dim in (
            ("obs_names", self.obs_names, self.obs_dim),
            ("obs_units", self.obs_units, self.obs_dim),
            ("action_names", self.action_names, self.act_dim),
            ("action_units", self.action_units, self.act_dim),
        ):
            if len(items) != dim:
                raise ValueError(f"task {self.name!r}: {what} has {len(items)} entries, not {dim}")
        if any(lo > hi for lo, hi in zip(self.workspace_low, self.workspace_high, strict=True)):
            raise ValueError(f"task {self.name!r}: workspace_low exceeds workspace_high")


_TASKS: dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add ``spec`` to the registry and return it; a second task under one id is an error."""
    if spec.name in _TASKS:
        raise DuplicateNameError(f"task {spec.name!r} is already registered")
    _TASKS[spec.name] = spec
    return spec


def get_task(name: str) -> TaskSpec:
    """The registered task ``name``; an unknown id lists the valid ones and the closest match."""
    try:
        return _TASKS[name]
    except KeyError:
        raise UnknownNameError("task", name, _TASKS) from None


def task_names() -> tuple[str, ...]:
    """Ids of every registered task, sorted."""
    return tuple(sorted(_TASKS))


register_task(
    TaskSpec(
        name="reach-v0",
        obs_dim=len(reach.OBS_NAMES),
        act_dim=len(reach.ACTION_NAMES),
        obs_names=reach.OBS_NAMES,
        obs_units=reach.OBS_UNITS,
        action_names=reach.ACTION_NAMES,
        action_units=reach.ACTION_UNITS,
        control_hz=reach.CONTROL_HZ,
        workspace_low=reach.WORKSPACE_LOW,
        workspace_high=reach.WORKSPACE_HIGH,
        asset_files=(reach.ARM7_XML,),
        make_env=reach.ReachEnv,
        success_tolerance=reach.SUCCESS_TOLERANCE,
    )
)
