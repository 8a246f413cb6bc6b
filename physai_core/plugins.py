"""Registries and plugins, the generic part every kind shares: a :class:`Registry` per kind,
the entry points that extend them (:func:`load_plugins`) and the ``module:attribute``
references they name code by (:func:`resolve_ref`).

A plugin declares entry points in the groups ``physai_flows.<kind>`` (``physai_flows.tasks``,
``physai_flows.backends``, ``physai_flows.algorithms``, ``physai_flows.targets``,
``physai_flows.dataset_formats``, ``physai_flows.environments``), as pytest plugins declare
``pytest11``. Each entry point names a callable taking no arguments that registers what the
package brings (``register_task(...)`` and the like); it is loaded and called once per process,
the first time any registry is read, so the CLI, Prefect workers and stage flow runs, torchrun
ranks and stage subprocesses all see the same plugins with no extra flag.

A plugin that fails to load stops the command, as a broken pytest plugin stops pytest: one line
naming the entry point, its package and its error (:class:`PluginError`, exit status 2).

It lives in the foundation package because every package registers something: edge its
targets, stages its tasks, backends, algorithms, dataset formats and stage environments.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import threading
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, Protocol, TypeVar

from physai_core.errors import DuplicateNameError, PhysaiError, UnknownNameError

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


class RefError(PhysaiError, ImportError):
    """A ``module:attribute`` reference that does not resolve: malformed, its module fails to
    import, or the module has no such attribute (an ImportError, as ``from module import name``
    raises for both)."""


def resolve_ref(ref: str, *, what: str) -> Any:
    """The object ``ref`` (``module:attribute``, the attribute possibly dotted) names, its
    module imported on this call.

    ``what`` says in messages what the reference is for (``stage 'train' runner``). Raises
    :class:`RefError`, one line naming the reference and what failed: the form, the import of
    the module (with its error), or the attribute. An error of physai-flows' own raised while
    importing (a missing extra, named) passes through unchanged.
    """
    module, sep, attr = ref.partition(":")
    if not sep or not module.strip() or not attr.strip():
        raise RefError(f"{what} {ref!r}: expected 'module:attribute'")
    try:
        found: Any = importlib.import_module(module)
    except PhysaiError:
        raise
    except Exception as exc:
        detail = " ".join(str(exc).split()) or "(no message)"
        raise RefError(f"{what} {ref!r}: importing module {module!r} failed: "
                       f"{type(exc).__name__}: {detail}") from exc
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise RefError(f"{what} {ref!r}: module {module!r} has no attribute "
                           f"{attr!r}") from None
    return found


def unknown_message(kind: str, name: str, valid: Iterable[str]) -> str:
    """Message for a name no list knows: the valid names and the closest match, if any."""
    names = sorted(valid)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r}; valid: {', '.join(names) or '(none)'}{hint}"


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
    """One registration point of one kind (tasks, backends, algorithms, edge targets, dataset
    formats, stage environments).

    Items are keyed by their ``name``. The shipped items (``builtins``, a callable) are
    registered before anything else, plugins' items included; the first read then loads every
    installed plugin (:func:`load_plugins`), so registering never imports a plugin and reading
    always sees them all. ``kind`` names the items in messages (``unknown simulator backend
    'x'; valid: ...``). A subclass chooses the errors (:meth:`unknown`, :meth:`duplicate`).
    """

    def __init__(self, kind: str, builtins: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._builtins = builtins
        self._items: dict[str, T] = {}
        self._builtin_done = False

    def unknown(self, name: str) -> Exception:
        """An :class:`UnknownNameError` listing the valid names and the closest one."""
        return UnknownNameError(self.kind, name, self._items)

    def duplicate(self, name: str) -> Exception:
        """A :class:`DuplicateNameError` naming the kind and the name."""
        return DuplicateNameError(f"{self.kind} {name!r} is already registered")

    def register(self, item: T) -> T:
        """Add ``item`` under its ``name`` and return it; a second one under one name is an
        error."""
        self._load_builtins()
        name = item.name
        if name in self._items:
            raise self.duplicate(name)
        self._items[name] = item
        return item

    def _load_builtins(self) -> None:
        """Register the shipped items, once."""
        with _lock:
            if not self._builtin_done:
                self._builtin_done = True
                if self._builtins is not None:
                    self._builtins()

    def load(self) -> None:
        """Register the shipped items once, then the plugins' (once per process)."""
        self._load_builtins()
        load_plugins()

    def get(self, name: str) -> T:
        """The item registered as ``name``; an unknown one lists the valid ones."""
        self.load()
        try:
            return self._items[name]
        except KeyError:
            raise self.unknown(name) from None

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
