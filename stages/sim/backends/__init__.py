"""``stages.sim.backends``: the promised path of :mod:`stages.sim.backends.catalog`, loaded on first
use.

An alias that plugins, stored records or commands name (docs/architecture.md, "Promised
paths");
the code lives in :mod:`stages.sim.backends.catalog`. Nothing inside the project imports
this module.
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
