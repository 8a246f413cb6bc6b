"""Plugins: packages outside this repository that add tasks, backends, algorithms, edge targets,
dataset formats or stage environments.

The machinery is :mod:`edge.registry` (edge targets are one of the kinds, and edge imports
nothing of stages): entry points in the groups ``physai_flows.<kind>``, loaded and called once
per process the first time any registry is read, a plugin that fails to load stopping the
command in one line (:class:`PluginError`, exit status 2), and ``module:attribute`` references
resolved by :func:`resolve_ref`. This module names all of it, and gives the registries of
stages their errors: an unknown name is an :class:`~stages.errors.UnknownNameError` listing the
valid ones, a second registration a :class:`~stages.errors.DuplicateNameError`.
"""

from __future__ import annotations

from edge.registry import (
    GROUP_PREFIX,
    KINDS,
    Named,
    PluginError,
    RefError,
    T,
    describe,
    load_plugins,
    resolve_ref,
)
from edge.registry import Registry as _Registry
from stages.errors import DuplicateNameError, UnknownNameError

__all__ = ["GROUP_PREFIX", "KINDS", "Named", "PluginError", "RefError", "Registry", "describe",
           "load_plugins", "resolve_ref"]


class Registry(_Registry[T]):
    """One registration point of one kind of stages (tasks, backends, algorithms, dataset
    formats, stage environments); see :class:`edge.registry.Registry`."""

    def unknown(self, name: str) -> Exception:
        """An :class:`UnknownNameError` listing the valid names and the closest one."""
        return UnknownNameError(self.kind, name, self._items)

    def duplicate(self, name: str) -> Exception:
        """A :class:`DuplicateNameError` naming the kind and the name."""
        return DuplicateNameError(f"{self.kind} {name!r} is already registered")
