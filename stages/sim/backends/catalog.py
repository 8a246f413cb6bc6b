"""The simulator-backend registry: what a suite's ``backend`` may name.

A backend is a name, the installed distributions whose versions pin every result it produces
(they enter the suite digest and the sim report), what installs it when it is missing, and the
environments it builds for the tasks it runs. MuJoCo is the default: a task's own factory
(``TaskSpec.make_env``) is its MuJoCo (or Gymnasium) environment. Another backend names its
factory per task, and may imply a stage environment (:mod:`stages.core.environments`): Isaac Lab's
runs in the ``isaaclab`` one, so every scene a suite validates on it runs as a subprocess of
that interpreter, and its versions are read from that interpreter's package metadata. A plugin
adds its own through the ``physai_flows.backends`` entry point group (:mod:`physai_core.plugins`) by
calling :func:`register_backend`. Looking a backend up imports no simulator.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, cast

from physai_core.errors import BackendUnavailableError, PhysaiError
from physai_core.plugins import Registry, resolve_ref
from stages.core.settings import camera_tiles as camera_tiles_setting
from stages.sim.env.capabilities import TilesCameras, capabilities_of

if TYPE_CHECKING:
    from stages.sim.env.batched import BatchedEnv
    from stages.sim.scenes.scene import Scene
    from stages.sim.tasks.catalog import TaskSpec

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
    tasks: Mapping[str, str] = field(default_factory=dict)
    """Task id -> ``module:callable`` that builds the task's batched environment on this
    backend, called as a task's ``make_env`` is; imported only when a scene is built. Empty for
    the default backend, which runs every task's own factory."""
    environment: str | None = None
    """The stage environment every scene on this backend runs in (``isaaclab``); None: any."""
    pinned: tuple[str, ...] = ()
    """More distributions whose versions pin the results (Newton and Warp under Isaac Lab)."""
    takes_device: bool = False
    """Whether its factories take ``device=`` (``auto``, ``cpu`` or ``cuda``:
    ``validate.device``)."""
    families: tuple[str, ...] = ()
    """Task families whose tasks are this backend's own (``isaaclab`` for
    ``isaaclab:<gym id>``): their own factory builds them here."""
    gym_ids: tuple[str, ...] = ()
    """Beginnings of Gymnasium ids whose environments live in this backend's stage environment
    (``metaworld:``, ``gymnasium_robotics:``): a ``gymnasium:`` task of one is probed and
    built there, and is this backend's own."""
    renders_cameras: bool = True
    """Whether its environments render a task's declared cameras (:mod:`stages.sim.env.cameras`);
    a task with cameras is refused on a backend that does not."""

    def runs(self, task: TaskSpec) -> bool:
        """Whether this backend can simulate ``task``: a task it names, one of its families,
        or (the default backend) any task that needs no stage environment of its own; a task
        with cameras only where the backend renders them."""
        if task.cameras and not self.renders_cameras:
            return False
        if task.name in self.tasks or self.owns(task.name):
            return True
        return self.name == DEFAULT and task.environment is None

    def owns(self, task: str) -> bool:
        """Whether ``task`` belongs to one of this backend's families, or is a Gymnasium id it
        claims."""
        return any(task.startswith(f"{family}:") for family in self.families) or any(
            task.startswith(f"gymnasium:{prefix}") for prefix in self.gym_ids)

    def runnable(self) -> str:
        """The tasks it runs, in words."""
        if self.name == DEFAULT:
            return "every task that needs no stage environment"
        return ", ".join([*sorted(self.tasks), *(f"{f}:<id>" for f in self.families),
                          *(f"gymnasium:{p}<id>" for p in self.gym_ids)])


def _register_builtins() -> None:
    register_backend(BackendSpec(
        "mujoco", "mujoco", None,
        "MuJoCo 4 in C, N worlds per batch stepped across threads (mujoco.batch)"))
    register_backend(BackendSpec(
        "isaaclab", "isaaclab", None,
        "Isaac Lab 3 kit-less on Newton (MuJoCo-Warp solver), in the isaaclab stage "
        "environment (make isaaclab)",
        tasks={"reach-v0": "stages.sim.backends.isaaclab_robot:IsaacLabReachEnv",
               "locomotion-v0": "stages.sim.backends.isaaclab_locomotion:IsaacLabLocomotionEnv"},
        environment="isaaclab", pinned=("newton", "warp-lang"), takes_device=True,
        families=("isaaclab",), renders_cameras=False))
    register_backend(BackendSpec(
        "metaworld", "metaworld", None,
        "MetaWorld 3's Sawyer tasks (gymnasium:metaworld:Meta-World/MT1 and its kin) on its "
        "own MuJoCo pin, in the metaworld stage environment (make metaworld)",
        environment="metaworld", pinned=("mujoco", "gymnasium"), gym_ids=("metaworld:",)))
    register_backend(BackendSpec(
        "gymnasium-robotics", "gymnasium-robotics", None,
        "Gymnasium-Robotics' Fetch and hand tasks (gymnasium:gymnasium_robotics:<id>) on a "
        "MuJoCo its code runs on, in the gymnasium-robotics stage environment (make "
        "gymnasium-robotics)",
        environment="gymnasium-robotics", pinned=("mujoco", "gymnasium"),
        gym_ids=("gymnasium_robotics:",)))


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
    """The installed version of backend ``name``: its distribution's version, followed by the
    pinned ones' (``3.0.0 newton-1.6.1 warp-lang-1.17.0``). For a backend whose stage
    environment is not this process, they are read from that environment's interpreter; a
    missing distribution names what installs it, a missing environment the make target."""
    spec = get_backend(name)
    if spec.environment is not None:
        from stages.core.environments import runs_here

        if not runs_here(spec.environment):
            return _version_there(spec.environment, (spec.distribution, *spec.pinned), name)
    found = _versions((spec.distribution, *spec.pinned))
    missing = [d for d, v in found.items() if v is None]
    if missing:
        if spec.extra is None and spec.environment is None:
            raise PhysaiError(f"simulator backend {spec.name!r}: its package "
                              f"{missing[0]!r} is not installed; reinstall physai-flows")
        raise BackendUnavailableError(spec.name, spec.extra or spec.name,
                                      PackageNotFoundError(missing[0]),
                                      environment=spec.environment)
    return _joined(found)


def _versions(distributions: tuple[str, ...]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in distributions:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def _joined(found: Mapping[str, str | None]) -> str:
    first, *rest = found.items()
    return " ".join([str(first[1]), *(f"{d}-{v}" for d, v in rest)])


@cache
def _version_there(environment: str, distributions: tuple[str, ...], backend: str) -> str:
    """:func:`backend_version` as the interpreter of ``environment`` reports it."""
    from stages.core.environments import require_python

    python = require_python(environment, f"simulator backend {backend!r}")
    script = ("import json, sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
              "def v(d):\n    try:\n        return version(d)\n"
              "    except PackageNotFoundError:\n        return None\n"
              "print(json.dumps({d: v(d) for d in sys.argv[1:]}))")
    done = subprocess.run([str(python), "-c", script, *distributions], capture_output=True,
                          text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise PhysaiError(f"simulator backend {backend!r}: {python} could not report its "
                          f"versions: {done.stderr.strip().splitlines()[-1:]}")
    found: dict[str, str | None] = json.loads(done.stdout)
    missing = [d for d, v in found.items() if v is None]
    if missing:
        raise PhysaiError(f"simulator backend {backend!r}: {missing[0]} is not installed in "
                          f"stage environment {environment!r} ({python}); rebuild it")
    return _joined(found)


def make_backend_env(
    backend: str, task: TaskSpec, scene: Scene, num_worlds: int, seed: int,
    *, num_threads: int | None = None, device: str = "auto", camera_tiles: str | None = None,
) -> BatchedEnv:
    """``num_worlds`` worlds of ``scene`` on ``backend``: the task's own factory on the default
    backend, else the factory the backend names for the task; the settings reach it here, once.

    Args:
        backend: A registered backend's name.
        task: The task of ``scene``.
        scene: The scene to simulate.
        num_worlds: Worlds stepped together.
        seed: Seed of every random draw of the environment.
        num_threads: C threads stepping the worlds (None: the default).
        device: Given to a backend that takes one (``auto`` simulates on a GPU when there is
            one).
        camera_tiles: How an environment that tiles its cameras renders them
            (``validate.camera_tiles``); None: ``$PHYSAI_CAMERA_TILES``, else ``auto``.
    """
    spec = get_backend(backend)
    if not spec.runs(task):
        raise PhysaiError(f"simulator backend {backend!r} does not run task {task.name!r}; "
                          f"it runs: {spec.runnable()}")
    ref = spec.tasks.get(task.name)
    if ref is None:
        factory: Any = task.make_env
    else:
        factory = resolve_ref(ref, what=f"simulator backend {backend!r} factory of task "
                                        f"{task.name!r}")
    extra = {"device": device} if spec.takes_device else {}
    env: BatchedEnv = factory(scene, num_worlds, seed, num_threads=num_threads, **extra)
    if capabilities_of(env).tiled_cameras:
        tiles = camera_tiles if camera_tiles is not None else camera_tiles_setting()
        cast(TilesCameras, env).tile_cameras(tiles)
    return env
