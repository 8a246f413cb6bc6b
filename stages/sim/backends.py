"""The simulator-backend registry: what a suite's ``backend`` may name.

A backend is a name, the installed distribution whose version pins every result it produces
(the version enters the suite digest and the sim report), and what installs it when it is
missing. MuJoCo is the shipped one; a plugin adds its own through the ``physai_flows.backends``
entry point group (:mod:`stages.plugins`) by calling :func:`register_backend`. Looking a backend
up imports no simulator: its version is read from the installed package's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from stages.errors import BackendUnavailableError, PhysaiError
from stages.plugins import Registry

DEFAULT = "mujoco"
"""The backend of a suite that names none."""


@dataclass(frozen=True)
class BackendSpec:
    """A simulator backend and how to tell which version of it ran."""

    name: str
    """What a suite's ``backend`` says, e.g. ``mujoco``."""
    distribution: str
    """Installed distribution whose version pins the backend's results, e.g. ``mujoco``."""
    extra: str | None
    """The pip extra of physai-flows that installs it, named when it is missing; None for a
    core dependency."""
    description: str
    """One line: what simulates, on what."""


def _register_builtins() -> None:
    register_backend(BackendSpec(
        "mujoco", "mujoco", None,
        "MuJoCo 4 in C, N worlds per batch stepped across threads (mujoco.batch)"))


BACKENDS: Registry[BackendSpec] = Registry("simulator backend", _register_builtins)
"""Every simulator backend, plugins' included."""


def register_backend(spec: BackendSpec) -> BackendSpec:
    """Add ``spec`` to the registry and return it; a second one under one name is an error."""
    return BACKENDS.register(spec)


def get_backend(name: str) -> BackendSpec:
    """The registered backend ``name``; an unknown one lists the valid ones."""
    return BACKENDS.get(name)


def backend_names() -> tuple[str, ...]:
    """Names of every registered backend, sorted."""
    return BACKENDS.names()


def backend_version(name: str) -> str:
    """The installed version of backend ``name``'s distribution; a missing one is a
    :class:`~stages.errors.BackendUnavailableError` naming what installs it."""
    spec = get_backend(name)
    try:
        return version(spec.distribution)
    except PackageNotFoundError as exc:
        if spec.extra is None:
            raise PhysaiError(f"simulator backend {spec.name!r}: its package "
                              f"{spec.distribution!r} is not installed; reinstall physai-flows"
                              ) from None
        raise BackendUnavailableError(spec.name, spec.extra, exc) from None
