"""Print the requirements pyproject.toml declares, with the named extras, one per line.

Usage: python scripts/requirements.py [EXTRA,EXTRA,...] > requirements.txt

The Makefile installs them into the shared dependency venv; the project itself goes into each
clone's own thin venv (pip's ``install .[extras]`` would put the project in the shared venv too).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """The project's dependencies followed by those of each named extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [name for name in extras if name not in optional]
    if unknown:
        raise SystemExit(f"{pyproject}: project.optional-dependencies: no extra {unknown[0]!r} "
                         f"(known: {', '.join(sorted(optional))})")
    out = list(project["dependencies"])
    for name in extras:
        out += [req for req in optional[name] if req not in out]
    return out


if __name__ == "__main__":
    names = [n for n in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if n]
    print("\n".join(requirements(Path(__file__).resolve().parents[1] / "pyproject.toml", names)))
