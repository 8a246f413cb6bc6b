"""The task registry: one registration point for every simulated task.

A task is a robot model plus its observation, action, reward, success predicate and scripted
expert. Tasks are registered under versioned ids (``reach-v0``); a change to any of those bumps
the version. A task family makes tasks on demand from ids ``<prefix>:<rest>``
(``gymnasium:InvertedPendulum-v5``). Registering fills a dict only: no model is loaded until
``make_env`` is called.

This module imports no task: the shipped ones (:mod:`stages.sim.backends.builtin_tasks`) and every
installed plugin's (:mod:`physai_core.plugins`) register on the first lookup.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from physai_core.errors import DuplicateNameError, UnknownNameError
from physai_core.plugins import Registry, resolve_ref
from stages.core.units import ActionRange
from stages.sim.env.batched import BatchedEnv
from stages.sim.env.cameras import CameraSpec, check_cameras

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene

Vec3 = tuple[float, float, float]
"""Three numbers: a point or box corner (x, y, z), or a command such as (vx, vy, yaw rate)."""


class EnvFactory(Protocol):
    """Builds a task's batched environment: ``num_worlds`` worlds of ``scene``, seeded."""

    def __call__(
        self, scene: Scene, num_worlds: int, seed: int, *, num_threads: int | None = None
    ) -> BatchedEnv:
        """The environment; ``num_threads`` C threads step it (None: the default count)."""
        ...


_TASK_ID = re.compile(
    r"^[a-z][a-z0-9_]*(-[a-z0-9_]+)*-v[0-9]+$"  # reach-v0
    r"|^[a-z][a-z0-9_]*:[A-Za-z0-9][A-Za-z0-9_./:-]*$"  # gymnasium:InvertedPendulum-v5
)


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
    target_names: tuple[str, ...]
    """What each axis of a scene's target box is, e.g. ``("x", "y", "z")``; one to three."""
    target_units: tuple[str, ...]
    """Unit of each axis of a scene's target box, e.g. ``("m", "m", "m")``."""
    workspace_low: tuple[float, ...]
    """Lower corner (target units) of the box that every scene's target box must lie in: the
    targets the scripted expert is known to reach."""
    workspace_high: tuple[float, ...]
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
    environment: str | None = None
    """The stage environment every stage that builds this task's environment runs in
    (``isaaclab`` for Isaac Lab's own tasks); None: any."""
    native_actions: ActionRange | None = None
    """How the normalized actions (-1..1 per entry, the convention every policy here acts in)
    map to the native units of the environment the task wraps (a ``gymnasium:`` task: its
    action Box's low..high); None: the environment takes the normalized actions themselves,
    so native and normalized coincide (stages/core/units.py)."""
    cameras: tuple[CameraSpec, ...] = ()
    """The cameras a policy of this task observes through, beside the state vector
    (:mod:`stages.sim.env.cameras`); none for a state task. Its environment renders them."""
    grasps_objects: bool = False
    """Whether the task has an object to grasp (lift-v0, pick-place-v0): only then may a scene
    set the manipulation fields of its randomization (``object_mass``, ...)."""

    def __post_init__(self) -> None:
        """Reject a spec whose id is not versioned or whose names and units do not match dims."""
        if not _TASK_ID.match(self.name):
            raise ValueError(f"task id {self.name!r} is not a versioned id like 'reach-v0' "
                             "nor a family id like 'gymnasium:InvertedPendulum-v5'")
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
        check_cameras(self.cameras, self.name)
        if self.native_actions is not None and self.native_actions.act_dim != self.act_dim:
            raise ValueError(f"task {self.name!r}: native_actions has "
                             f"{self.native_actions.act_dim} entries, not {self.act_dim}")

    def action_range(self) -> ActionRange:
        """The native range of the task's actions (-1..1 per entry when it states none)."""
        return self.native_actions or ActionRange.identity(self.act_dim)


TaskFamily = Callable[[str], TaskSpec]
"""Makes the task ``<prefix>:<rest>`` from ``rest`` (``gymnasium:InvertedPendulum-v5``)."""

_FAMILIES: dict[str, TaskFamily] = {}

_BUILTIN = ("stages.sim.backends.builtin_tasks:register",)
"""Registration functions of the tasks this project ships, imported on first lookup."""


def _register_builtins() -> None:
    for ref in _BUILTIN:
        resolve_ref(ref, what="task registration")()


TASKS: Registry[TaskSpec] = Registry("task", _register_builtins)
"""Every task, plugins' included (family-made ones once they were looked up)."""


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add ``spec`` to the registry and return it; a second task under one id is an error."""
    return TASKS.register(spec)


def register_task_family(prefix: str, make: TaskFamily) -> None:
    """Let ``make`` build every task whose id is ``<prefix>:<rest>``, on first lookup."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", prefix):
        raise ValueError(f"task family prefix {prefix!r} is not a lowercase word")
    if prefix in _FAMILIES:
        raise DuplicateNameError(f"task family {prefix!r} is already registered")
    _FAMILIES[prefix] = make


def get_task(name: str) -> TaskSpec:
    """The registered task ``name``; an unknown id lists the valid ones and the closest match.

    ``<prefix>:<rest>`` ids are made by the task family registered under ``prefix`` on first
    lookup, then kept.
    """
    found = TASKS.find(name)
    if found is not None:
        return found
    prefix, sep, rest = name.partition(":")
    if sep and prefix in _FAMILIES:
        return TASKS.add_if_absent(name, _FAMILIES[prefix](rest))
    valid = [*TASKS.names(), *(f"{p}:<id>" for p in _FAMILIES)]
    raise UnknownNameError("task", name, valid) from None


def task_names() -> tuple[str, ...]:
    """Ids of every registered task, sorted (family-made ones once they were looked up)."""
    return TASKS.names()
