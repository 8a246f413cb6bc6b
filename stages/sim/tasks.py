"""The task registry: one registration point for every simulated task.

A task is a robot model plus its observation, action, reward, success predicate and scripted
expert. Tasks are registered under versioned ids (``reach-v0``); a change to any of those bumps
the version. Registering fills a dict only: no model is loaded until ``make_env`` is called.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from stages.errors import DuplicateNameError, UnknownNameError
from stages.sim import locomotion, reach
from stages.sim.batched import BatchedEnv

if TYPE_CHECKING:
    from stages.sim.scene import Scene

Vec3 = tuple[float, float, float]
"""Three numbers: a point or box corner (x, y, z), or a command such as (vx, vy, yaw rate)."""


class EnvFactory(Protocol):
    """Builds a task's batched environment: ``num_worlds`` worlds of ``scene``, seeded."""

    def __call__(
        self, scene: Scene, num_worlds: int, seed: int, *, num_threads: int | None = None
    ) -> BatchedEnv:
        """The environment; ``num_threads`` C threads step it (None: the default count)."""
        ...


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
    target_names: tuple[str, str, str]
    """What each axis of a scene's target box is, e.g. ``("x", "y", "z")``."""
    target_units: tuple[str, str, str]
    """Unit of each axis of a scene's target box, e.g. ``("m", "m", "m")``."""
    workspace_low: Vec3
    """Lower corner (target units) of the box that every scene's target box must lie in: the
    targets the scripted expert is known to reach."""
    workspace_high: Vec3
    """Upper corner (target units) of the box that every scene's target box must lie in."""
    floating_base: bool
    """Whether the robot's base is free-floating; only then may a scene push it."""
    asset_files: tuple[Path, ...]
    """Model files (MJCF, meshes) the environment loads; their bytes enter every suite digest."""
    camera: str
    """Name of the model camera that rollout videos are rendered from."""
    make_env: EnvFactory
    """Factory ``make_env(scene, num_worlds, seed, *, num_threads=None)`` of the batched
    environment."""
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
