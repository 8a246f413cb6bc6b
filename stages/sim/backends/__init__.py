"""Simulator backends: the backend registry (:mod:`stages.sim.backends.catalog`), the shipped
tasks' registration, and the adapters (Gymnasium environments as tasks, Isaac Lab's robots and
its own registered tasks). May import ``stages.sim.tasks``, ``stages.sim.env`` and
``stages.sim.scenes`` and the layers below ``stages.sim``.

This package is also ``stages.sim.backends``, the promised path of
:mod:`stages.sim.backends.catalog` that docs/extending.md gives plugins (``register_backend``,
``BackendSpec``): it names the registry's names, loaded on first use, and nothing inside the
project imports them from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stages.sim.backends.catalog import (
        BACKENDS as BACKENDS,
    )
    from stages.sim.backends.catalog import (
        DEFAULT as DEFAULT,
    )
    from stages.sim.backends.catalog import (
        BackendSpec as BackendSpec,
    )
    from stages.sim.backends.catalog import (
        backend_names as backend_names,
    )
    from stages.sim.backends.catalog import (
        backend_version as backend_version,
    )
    from stages.sim.backends.catalog import (
        get_backend as get_backend,
    )
    from stages.sim.backends.catalog import (
        make_backend_env as make_backend_env,
    )
    from stages.sim.backends.catalog import (
        register_backend as register_backend,
    )

_NAMES = frozenset({
    "BACKENDS",
    "BackendSpec",
    "DEFAULT",
    "backend_names",
    "backend_version",
    "get_backend",
    "make_backend_env",
    "register_backend",
})


def __getattr__(name: str) -> Any:
    """A name of the real module, imported on first use: importing a module of this folder
    never loads the registry through its parent."""
    if name in _NAMES:
        return getattr(importlib.import_module("stages.sim.backends.catalog"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
