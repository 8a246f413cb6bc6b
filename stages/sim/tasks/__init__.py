"""Tasks written once, apart from any simulator: the task registry
(:mod:`stages.sim.tasks.catalog`), reach and reach-vision on a 7-DOF arm, locomotion on a
quadruped with its scripted gait, and task templates (a reach task of any arm model, from a
task file). May import ``stages.sim.env`` and ``stages.sim.scenes`` and the layers below
``stages.sim``.

This package is also ``stages.sim.tasks``, the promised path of
:mod:`stages.sim.tasks.catalog` that docs/extending.md gives plugins (``register_task``,
``TaskSpec``): it names the registry's names, loaded on first use, and nothing inside the
project imports them from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stages.sim.tasks.catalog import (
        TASKS as TASKS,
    )
    from stages.sim.tasks.catalog import (
        EnvFactory as EnvFactory,
    )
    from stages.sim.tasks.catalog import (
        TaskFamily as TaskFamily,
    )
    from stages.sim.tasks.catalog import (
        TaskSpec as TaskSpec,
    )
    from stages.sim.tasks.catalog import (
        Vec3 as Vec3,
    )
    from stages.sim.tasks.catalog import (
        get_task as get_task,
    )
    from stages.sim.tasks.catalog import (
        register_task as register_task,
    )
    from stages.sim.tasks.catalog import (
        register_task_family as register_task_family,
    )
    from stages.sim.tasks.catalog import (
        task_names as task_names,
    )

_NAMES = frozenset({
    "EnvFactory",
    "TASKS",
    "TaskFamily",
    "TaskSpec",
    "Vec3",
    "get_task",
    "register_task",
    "register_task_family",
    "task_names",
})


def __getattr__(name: str) -> Any:
    """A name of the real module, imported on first use: importing a module of this folder
    never loads the registry through its parent."""
    if name in _NAMES:
        return getattr(importlib.import_module("stages.sim.tasks.catalog"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
