"""File references in configs: a path relative to the file that names it, or a resource of an
installed package.

``pkg:PACKAGE/PATH`` names the file ``PATH`` inside the installed package ``PACKAGE``
(``pkg:sim_scenes/reach/nominal.yaml``, ``pkg:gymnasium/envs/mujoco/assets/pusher_v5.xml``), so
a config in an empty folder can use the scenes and models a package ships, wherever it was
installed. Anything else is a path, relative to the folder of the file that names it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PREFIX = "pkg:"


def is_resource(ref: str) -> bool:
    """Whether ``ref`` names a package resource (``pkg:PACKAGE/PATH``)."""
    return ref.startswith(PREFIX)


def resolve_file(ref: str, base: Path) -> Path:
    """The file ``ref`` names, resolved against the folder ``base``; it may not exist.

    Raises:
        ValueError: a ``pkg:`` reference that is malformed or whose package is not installed
            (the message says which, in one line).
    """
    if not is_resource(ref):
        return (base / ref).resolve()
    package, _, inner = ref.removeprefix(PREFIX).partition("/")
    parts = Path(inner).parts
    if not package or not inner or any(p in ("..", "") for p in parts) or Path(inner).is_absolute():
        raise ValueError(f"expected {PREFIX}PACKAGE/PATH inside the package, got {ref!r}")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {package!r} of {ref!r} is not installed")
    roots = [Path(p) for p in spec.submodule_search_locations]
    for root in roots:
        if (root / inner).exists():
            return (root / inner).resolve()
    return (roots[0] / inner).resolve()


def inside_folder(ref: str | Path, root: Path) -> Path:
    """The file ``ref`` names (absolute, or relative to ``root``), symlinks followed, which
    must lie inside the folder ``root``; nothing is read.

    Raises:
        ValueError: ``ref`` leads outside ``root`` (an absolute path elsewhere, a ``..``
            escape or a symlink pointing out), said in one line.
    """
    root = root.resolve()
    resolved = (root / ref).resolve()
    if not resolved.is_relative_to(root):
        raise ValueError(f"leads outside the project folder {root} (to {resolved})")
    return resolved
