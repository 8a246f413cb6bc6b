"""Stage environments: a stage that runs in an interpreter of its own.

Some stages need packages that cannot share the project's environment: Isaac Lab's Newton pins
MuJoCo 3.12 while the project runs MuJoCo 4.0. OSMO answers such clashes with one container
image per task; this does the same. A stage environment is a name, the local interpreter that
a make target builds, and the container image a Kubernetes pool runs it in. A config names one
per stage (``validate: {environment: isaaclab}``); locally that stage then runs as a
subprocess of the environment's interpreter (:mod:`stages.pipeline.envrun`), which exchanges only
store digests and typed records with the pipeline, as the torchrun launch does; through Prefect
dispatch the environment's image goes into the pool's job variables.

Isaac Lab's (``make isaaclab``), LeRobot's (``make lerobot``: LeRobot 0.6 needs Python 3.12
and torch < 2.12), MetaWorld's (``make metaworld``: it pins MuJoCo 3.3) and Gymnasium-Robotics'
(``make gymnasium-robotics``: its Fetch code fails on MuJoCo >= 3.12) are the shipped ones. A
plugin adds its own through the ``physai_flows.environments`` entry point group by calling
:func:`register_environment`.
``PHYSAI_ENV_<NAME>_PYTHON`` (the name upper-cased, ``-`` as ``_``) points an environment at
another interpreter, e.g. a team's own venv or a cluster's module.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from physai_core.errors import PhysaiError
from physai_core.plugins import Registry

ROOT = Path(__file__).resolve().parents[2]
INSIDE_ENV = "PHYSAI_STAGE_ENVIRONMENT"
"""Set to the environment's name in a stage subprocess: the stage runs there, not again."""


class EnvironmentMissingError(PhysaiError):
    """A stage names an environment whose interpreter is not there."""

    exit_code = 2


@dataclass(frozen=True)
class StageEnvironment:
    """An interpreter a stage may run in, and how to get it."""

    name: str
    """What a stage's ``environment`` says, e.g. ``isaaclab``."""
    venv: str
    """Its venv, relative to the project's folder (``.venv-isaaclab``), or an absolute path."""
    make_target: str | None
    """The make target that builds it, named when it is missing."""
    image: str | None
    """The container image a Kubernetes work pool runs the stage in."""
    description: str
    """One line: what it holds."""

    @property
    def python_variable(self) -> str:
        """The variable that points this environment at another interpreter."""
        return f"PHYSAI_ENV_{self.name.upper().replace('-', '_')}_PYTHON"

    def python(self) -> Path:
        """Its interpreter: ``$PHYSAI_ENV_<NAME>_PYTHON``, else the venv's ``bin/python``."""
        given = os.environ.get(self.python_variable, "").strip()
        if given:
            return Path(given)
        venv = Path(self.venv)
        return (venv if venv.is_absolute() else ROOT / venv) / "bin" / "python"


def _register_builtins() -> None:
    register_environment(StageEnvironment(
        "isaaclab", ".venv-isaaclab", "isaaclab",
        os.environ.get("PHYSAI_ENV_ISAACLAB_IMAGE") or "physai-flows-isaaclab:0.1.0",
        "Isaac Lab 3 kit-less with Newton (MuJoCo-Warp), beside MuJoCo 4 (scripts/"
        "install_isaaclab.sh); on Kubernetes the image a team builds from that script "
        "(PHYSAI_ENV_ISAACLAB_IMAGE)"))
    register_environment(StageEnvironment(
        "lerobot", ".venv-lerobot", "lerobot",
        os.environ.get("PHYSAI_ENV_LEROBOT_IMAGE") or "physai-flows-lerobot:0.1.0",
        "LeRobot 0.6.1 (its datasets and policies) on Python 3.12 with torch 2.11 "
        "(scripts/install_lerobot.sh); on Kubernetes the image a team builds from that script "
        "(PHYSAI_ENV_LEROBOT_IMAGE)"))
    register_environment(StageEnvironment(
        "metaworld", ".venv-metaworld", "metaworld",
        os.environ.get("PHYSAI_ENV_METAWORLD_IMAGE") or "physai-flows-metaworld:0.1.0",
        "MetaWorld 3.1.1 on its own pin, MuJoCo 3.3.0 (scripts/install_benchmark.sh); on "
        "Kubernetes the image a team builds from that script (PHYSAI_ENV_METAWORLD_IMAGE)"))
    register_environment(StageEnvironment(
        "gymnasium-robotics", ".venv-gymnasium-robotics", "gymnasium-robotics",
        os.environ.get("PHYSAI_ENV_GYMNASIUM_ROBOTICS_IMAGE")
        or "physai-flows-gymnasium-robotics:0.1.0",
        "Gymnasium-Robotics 1.4.2 on a MuJoCo 3 its Fetch code runs on "
        "(scripts/install_benchmark.sh); on Kubernetes the image a team builds from that "
        "script (PHYSAI_ENV_GYMNASIUM_ROBOTICS_IMAGE)"))


ENVIRONMENTS: Registry[StageEnvironment] = Registry("stage environment", _register_builtins)
"""Every stage environment, plugins' included."""


def register_environment(env: StageEnvironment) -> StageEnvironment:
    """Add ``env`` to the registry and return it; a second one under one name is an error."""
    return ENVIRONMENTS.register(env)


def get_environment(name: str) -> StageEnvironment:
    """The registered environment ``name``; an unknown one lists the valid ones."""
    return ENVIRONMENTS.get(name)


def require_python(name: str, where: str) -> Path:
    """The interpreter of environment ``name``, which ``where`` (a file and field) names; a
    missing one is one line naming what builds it (exit status 2)."""
    env = get_environment(name)
    python = env.python()
    if os.access(python, os.X_OK):
        return python
    build = f"`make {env.make_target}`" if env.make_target else "its own installer"
    raise EnvironmentMissingError(
        f"{where}: stage environment {name!r} is not built ({python} is missing); build it "
        f"with {build}, or set {env.python_variable} to its interpreter")


def runs_here(name: str | None) -> bool:
    """Whether a stage in environment ``name`` runs in this process: no environment, or this
    process is already that environment's stage subprocess (or its interpreter)."""
    if name is None or os.environ.get(INSIDE_ENV) == name:
        return True
    # A venv's python is a link to the base interpreter, so compare the venvs, not the files.
    venv = get_environment(name).python().parent.parent
    return venv.exists() and Path(sys.prefix).resolve() == venv.resolve()
