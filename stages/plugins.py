"""Plugins: packages outside this repository that add tasks, backends, algorithms, edge targets,
dataset formats or stage environments.

A plugin declares entry points in the groups ``physai_flows.<kind>`` (``physai_flows.tasks``,
``physai_flows.backends``, ``physai_flows.algorithms``, ``physai_flows.targets``,
``physai_flows.dataset_formats``, ``physai_flows.environments``), as pytest plugins declare
``pytest11``. Each entry point names a callable taking no arguments that registers what the
package brings (``register_task(...)`` and the like); it is loaded and called once per process,
the first time any registry is read, so the CLI, Prefect workers and stage flow runs, torchrun
ranks and stage subprocesses all see the same plugins with no extra flag.

A plugin that fails to load stops the command, as a broken pytest plugin stops pytest: one line
naming the entry point, its package and its error (:class:`PluginError`, exit status 2).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, Protocol, TypeVar

from stages.errors import DuplicateNameError, PhysaiError, UnknownNameError

log = logging.getLogger(__name__)

KINDS = ("tasks", "backends", "algorithms", "targets", "dataset_formats", "environments")
"""Registry kinds a plugin may extend; each is the entry-point group ``physai_flows.<kind>``."""

GROUP_PREFIX = "physai_flows."



class Named(Protocol):
    """What a registry holds: anything with a name."""

    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)

_lock = threading.RLock()
_loaded: list[str] = []
_loading = False


class PluginError(PhysaiError):
    """An installed plugin whose entry point could not be loaded or failed to register."""

    exit_code = 2


def describe(ep: EntryPoint) -> str:
    """``group:name = value (package version)``: how a message names an entry point."""
    dist = getattr(ep, "dist", None)
    package = f" ({dist.name} {dist.version})" if dist is not None else ""
    return f"{ep.group}:{ep.name} = {ep.value}{package}"


def load_plugins() -> tuple[str, ...]:
    """Load and call every installed ``physai_flows.*`` entry point once per process.

    Returns the entry points loaded (as :func:`describe` names them). Raises
    :class:`PluginError` naming the first one that fails; the next call tries again.
    """
    global _loading
    with _lock:
        if _loaded or _loading:
            return tuple(_loaded)
        _loading = True
        try:
            found = [ep for kind in KINDS for ep in entry_points(group=GROUP_PREFIX + kind)]
            for ep in sorted(found, key=lambda e: (KINDS.index(e.group[len(GROUP_PREFIX):]),
                                                     e.name)):
                _call(ep)
                _loaded.append(describe(ep))
        except PluginError:
            _loaded.clear()
            raise
        finally:
            _loading = False
        log.debug("plugins loaded: %s", ", ".join(_loaded) or "none")
        return tuple(_loaded)


def _call(ep: EntryPoint) -> None:
    """Load ``ep`` and call what it names; any failure is one :class:`PluginError` line."""
    try:
        register = ep.load()
        if not callable(register):
            raise TypeError(f"{ep.value} is a {type(register).__name__}, not a callable")
        register()
    except PluginError:
        raise
    except Exception as exc:
        detail = " ".join(str(exc).split()) or "(no message)"
        raise PluginError(
            f"plugin entry point {describe(ep)} failed to load: {type(exc).__name__}: {detail}"
        ) from exc


class Registry(Generic[T]):
    """One registration point of one kind (tasks, backends, algorithms, dataset formats).

    Items are keyed by their ``name``. The first read registers the shipped items (``builtins``,
    a callable) and then every installed plugin (:func:`load_plugins`), so registering never
    imports a plugin and reading always sees them all. ``kind`` names the items in messages
    (``unknown simulator backend 'x'; valid: ...``).
    """

    def __init__(self, kind: str, builtins: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._builtins = builtins
        self._items: dict[str, T] = {}
        self._builtin_done = False

    def register(self, item: T) -> T:
        """Add ``item`` under its ``name`` and return it; a second one under one name is an
        error."""
        name = item.name
        if name in self._items:
            raise DuplicateNameError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def load(self) -> None:
        """Register the shipped items once, then the plugins' (once per process)."""
        with _lock:
            if not self._builtin_done:
                self._builtin_done = True
                if self._builtins is not None:
                    self._builtins()
        load_plugins()

    def get(self, name: str) -> T:
        """The item registered as ``name``; an unknown one lists the valid ones."""
        self.load()
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self._items) from None

    def find(self, name: str) -> T | None:
        """The item registered as ``name``, or None."""
        self.load()
        return self._items.get(name)

    def add_if_absent(self, name: str, item: T) -> T:
        """Keep ``item`` under ``name`` unless one is there already; return the kept one."""
        return self._items.setdefault(name, item)

    def names(self) -> tuple[str, ...]:
        """Names of every registered item, sorted."""
        self.load()
        return tuple(sorted(self._items))
