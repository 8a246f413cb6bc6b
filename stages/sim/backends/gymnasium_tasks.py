"""Gymnasium environments as tasks: ``task: gymnasium:<EnvId>``.

Any environment an installed package registers with Gymnasium is a task: its spaces give the
observation and action names, its ``dt`` (or metadata ``render_fps``) the control rate, and a
MuJoCo model file, if it has one, the asset whose bytes enter the suite digest. An id
``pkg.mod:Env-v0`` imports ``pkg.mod`` first, as ``gymnasium.make`` does; an id ``pkg/Env-v0``
whose namespace nobody has registered yet imports the module ``pkg`` first.

The environment is probed once, with the make_kwargs of the first scene of the task that is
loaded (:func:`offer_make_kwargs`): MetaWorld's ``metaworld:Meta-World/MT1`` cannot be made without
an ``env_name``. A benchmark whose package cannot live beside the project's MuJoCo (MetaWorld,
Gymnasium-Robotics) has a simulator backend that claims its ids (``BackendSpec.gym_ids``) and
a stage environment: the probe then runs in that environment's interpreter
(``python -m stages.sim.backends.gymnasium_tasks describe ID``), the task says so
(``TaskSpec.environment``), and every stage that builds its environment runs there.

The worlds of an environment are :class:`stages.sim.backends.gymnasium_env.GymBatchedEnv`.
Episodes last the scene's ``episode_steps``: a world whose environment terminates
early keeps its final observation and info, earns no more reward and waits for the others, so
the success predicate sees how the episode ended; in PPO training it restarts instead
(``step(..., restart_fallen=True)``). Gymnasium itself is imported only when a task of this
family is looked up.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.metadata
import importlib.util
import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from physai_core.errors import BackendUnavailableError
from stages.core.units import ActionRange
from stages.sim.backends.gymnasium_env import (
    CAMERA,
    GymBatchedEnv,
    GymEnvError,
    _bounded_action_box,
    _first_line,
    _gymnasium,
    _make,
)
from stages.sim.scenes.scene import SUCCESS_HELP
from stages.sim.tasks.catalog import TaskSpec

if TYPE_CHECKING:
    import gymnasium

    from stages.sim.env.batched import BatchedEnv
    from stages.sim.scenes.scene import Scene

PREFIX = "gymnasium"
"""Task family prefix: ``gymnasium:InvertedPendulum-v5`` is Gymnasium's ``InvertedPendulum-v5``."""

RESERVED_MAKE_KWARGS = frozenset(
    {"max_episode_steps", "autoreset", "apply_api_compatibility", "disable_env_checker",
     "render_mode"}
)
"""``gymnasium.make`` arguments a scene cannot set: the scene's episode_steps sets the time
limit, and the pipeline decides autoreset and rendering."""


def is_gym_task(task: str) -> bool:
    """Whether ``task`` is an id of this family (``gymnasium:<EnvId>``)."""
    return task.startswith(f"{PREFIX}:")


def resolve_env_id(rest: str) -> str:
    """The Gymnasium id that ``gymnasium:<rest>`` names, importing its module first.

    ``pkg.mod:Env-v0`` imports ``pkg.mod``; ``pkg/Env-v0`` imports ``pkg`` when no environment
    of that namespace is registered yet. An id that is still unknown raises
    :class:`GymEnvError` listing the close matches on one line.
    """
    gym = _gymnasium()
    module, sep, env_id = rest.rpartition(":")
    if sep:
        _import_module(module, rest)
    else:
        env_id = rest
    registry = gym.envs.registry
    namespace = env_id.partition("/")[0] if "/" in env_id else None
    if env_id not in registry and namespace is not None and not any(
        key.startswith(f"{namespace}/") for key in registry
    ):
        try:
            found = importlib.util.find_spec(namespace) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            _import_module(namespace, rest)
    if env_id not in registry:
        close = difflib.get_close_matches(env_id, list(registry), n=5, cutoff=0.6)
        hint = f"close matches: {', '.join(close)}" if close else "no close match"
        raise GymEnvError(
            f"unknown Gymnasium environment {env_id!r} ({hint}; {len(registry)} ids are "
            "registered; an id pkg.mod:Env-v0 or pkg/Env-v0 imports its module first)"
        )
    return env_id


def _import_module(module: str, rest: str) -> None:
    """Import the module that registers the environment ``rest``; failing is a GymEnvError."""
    try:
        importlib.import_module(module)
    except Exception as exc:
        raise GymEnvError(
            f"gymnasium:{rest}: module {module!r} that should register it does not import "
            f"({_first_line(exc)})"
        ) from None


def space_names(space: gymnasium.Space, prefix: str) -> list[str]:
    """A name for every entry of ``gymnasium.spaces.flatten(space, x)``, in its order.

    A Box, Discrete (one-hot) or other leaf space gives ``prefix[i]``; a Dict recurses into its
    keys in the space's own order (``key[i]``, ``outer.inner[i]``), a Tuple into its items.
    """
    from gymnasium import spaces

    def join(name: str) -> str:
        return f"{prefix}.{name}" if prefix else name

    if isinstance(space, spaces.Dict):
        return [n for key, sub in space.spaces.items() for n in space_names(sub, join(str(key)))]
    if isinstance(space, spaces.Tuple):
        return [n for j, sub in enumerate(space.spaces) for n in space_names(sub, join(str(j)))]
    return [f"{prefix or 'obs'}[{i}]" for i in range(spaces.flatdim(space))]


def _control_hz(env_id: str, env: gymnasium.Env) -> float:
    """The control rate: 1 / the environment's ``dt``, else its metadata ``render_fps``."""
    dt = getattr(env.unwrapped, "dt", None)
    if isinstance(dt, (int, float)) and dt > 0:
        return 1.0 / float(dt)
    fps = env.metadata.get("render_fps")
    if isinstance(fps, (int, float)) and fps > 0:
        return float(fps)
    raise GymEnvError(f"Gymnasium environment {env_id!r} has neither a dt nor a metadata "
                      "render_fps to take its control rate from")


_FIRST_KWARGS: dict[str, dict[str, Any]] = {}
"""The make_kwargs of the first scene of each ``gymnasium:`` task loaded, by the id's rest."""

_FACTS: dict[tuple[str, str], dict[str, Any]] = {}
"""Probes done, by (the id's rest, its make_kwargs as JSON)."""


def offer_make_kwargs(task: str, make_kwargs: dict[str, Any]) -> None:
    """Note a scene's make_kwargs for task ``task``: the first offered for a task are those
    it is probed with (a scene loader offers them before the task is looked up)."""
    if is_gym_task(task):
        _FIRST_KWARGS.setdefault(task.removeprefix(f"{PREFIX}:"), dict(make_kwargs))


def _backend_of(rest: str) -> Any:
    """The simulator backend whose stage environment holds Gymnasium id ``rest``, or None."""
    from stages.sim.backends.catalog import BACKENDS

    for name in BACKENDS.names():
        backend = BACKENDS.get(name)
        if any(rest.startswith(prefix) for prefix in backend.gym_ids):
            return backend
    return None


def environment_of(task: str) -> str | None:
    """The stage environment a ``gymnasium:`` task's environments are built in (None: any)."""
    backend = _backend_of(task.removeprefix(f"{PREFIX}:"))
    return backend.environment if backend is not None else None


def probe(rest: str, make_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the pipeline needs of environment ``rest`` made with ``make_kwargs``, probed in
    this process: its observation names, action Box, control rate, whether it renders, its
    model file and its provenance (JSON-able)."""
    env_id = resolve_env_id(rest)
    made = _make(env_id, **make_kwargs)
    try:
        low, high = _bounded_action_box(env_id, made.action_space)
        facts = {"env_id": env_id, "obs_names": space_names(made.observation_space, ""),
                 "low": low.tolist(), "high": high.tolist(),
                 "control_hz": _control_hz(env_id, made),
                 "renderable": CAMERA in made.metadata.get("render_modes", ()),
                 "model_file": getattr(made.unwrapped, "fullpath", None)}
    finally:
        made.close()
    facts["provenance"] = _provenance_here(env_id)
    return facts


def facts_of(rest: str, make_kwargs: dict[str, Any]) -> dict[str, Any]:
    """:func:`probe` of ``rest`` with ``make_kwargs``, once per process: here, or in the stage
    environment of the backend that claims the id."""
    key = (rest, json.dumps(make_kwargs, sort_keys=True))
    if key not in _FACTS:
        _FACTS.update(_probed(rest, [make_kwargs]))
    return _FACTS[key]


def prefetch(task: str, kwargs_sets: list[dict[str, Any]]) -> None:
    """Probe a ``gymnasium:`` task under every scene's make_kwargs in one go (a suite's scenes:
    one interpreter started for all where the task lives in a stage environment); a failure
    is left for the per-scene check to say."""
    if not is_gym_task(task):
        return
    rest = task.removeprefix(f"{PREFIX}:")
    todo = [k for k in kwargs_sets if (rest, json.dumps(k, sort_keys=True)) not in _FACTS]
    if todo:
        with contextlib.suppress(GymEnvError):
            _FACTS.update(_probed(rest, todo))


def _probed(rest: str, kwargs_sets: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    backend = _backend_of(rest)
    environment = backend.environment if backend is not None else None
    from stages.core.environments import runs_here

    if runs_here(environment):
        return {(rest, json.dumps(k, sort_keys=True)): probe(rest, k) for k in kwargs_sets}
    return _probed_there(str(environment), rest, kwargs_sets)


def _probed_there(environment: str, rest: str, kwargs_sets: list[dict[str, Any]]
                  ) -> dict[tuple[str, str], Any]:
    """:func:`probe` run by ``environment``'s interpreter for each make_kwargs."""
    import os
    import subprocess

    from stages.core.environments import INSIDE_ENV, ROOT, require_python

    python = require_python(environment, f"task {PREFIX}:{rest}")
    env = {**os.environ, INSIDE_ENV: environment, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([str(python), "-m", "stages.sim.backends.gymnasium_tasks", "describe",
                           rest, json.dumps(kwargs_sets)],
                          capture_output=True, text=True, env=env, check=False, timeout=600)
    if done.returncode != 0:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "")
        raise GymEnvError(f"{last.removeprefix('error: ')} (in stage environment "
                          f"{environment!r})")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {(rest, json.dumps(k, sort_keys=True)): f
            for k, f in zip(kwargs_sets, found, strict=True)}


def make_task(rest: str) -> TaskSpec:
    """The task ``gymnasium:<rest>``, built once from a probe of the environment made with the
    first scene's make_kwargs (:func:`offer_make_kwargs`; none offered: made without)."""
    name = f"{PREFIX}:{rest}"
    given = _FIRST_KWARGS.get(rest)
    try:
        facts = facts_of(rest, given or {})
    except GymEnvError as exc:
        if given is None and "cannot be made" in exc.message:
            raise GymEnvError(f"{exc.message}; a scene of the task gives what it needs in "
                              "make_kwargs") from None
        raise
    env_id, renderable = str(facts["env_id"]), bool(facts["renderable"])
    low, high = np.asarray(facts["low"], np.float64), np.asarray(facts["high"], np.float64)
    obs_names = tuple(facts["obs_names"])
    model_file = facts["model_file"]
    assets = (Path(model_file),) if isinstance(model_file, str) and Path(model_file).is_file() \
        else ()

    def make_env(
        scene: Scene, num_worlds: int, seed: int, *, num_threads: int | None = None
    ) -> BatchedEnv:
        return GymBatchedEnv(scene, num_worlds, seed, task_name=name, env_id=env_id,
                             renderable=renderable)

    return TaskSpec(
        name=name,
        obs_dim=len(obs_names),
        act_dim=low.size,
        obs_names=obs_names,
        obs_units=("",) * len(obs_names),
        action_names=tuple(f"act[{i}]" for i in range(low.size)),
        action_units=tuple(ActionRange.of([lo], [hi]).describe() for lo, hi in zip(low, high,
                                                                                     strict=True)),
        control_hz=float(facts["control_hz"]),
        target_names=("-", "-", "-"),
        target_units=("-", "-", "-"),
        workspace_low=(0.0, 0.0, 0.0),
        workspace_high=(0.0, 0.0, 0.0),
        floating_base=False,
        asset_files=assets,
        camera=CAMERA,
        make_env=make_env,
        success_tolerance=SUCCESS_HELP,
        native_actions=ActionRange.of(low, high),
        environment=environment_of(name),
    )


def make_kwargs_problem(task: str, make_kwargs: dict[str, Any]) -> str | None:
    """Why the scene's ``make_kwargs`` do not suit task ``task``, or None: the environment
    must build with them and keep the task's observation and action sizes."""
    from stages.sim.tasks.catalog import get_task

    spec = get_task(task)
    try:
        facts = facts_of(task.removeprefix(f"{PREFIX}:"), make_kwargs)
    except GymEnvError as exc:
        return exc.message
    obs_dim, act_dim = len(facts["obs_names"]), len(facts["low"])
    if (obs_dim, act_dim) != (spec.obs_dim, spec.act_dim):
        return (f"they change the spaces of {facts['env_id']!r}: observation {obs_dim} and "
                f"action {act_dim} entries, the task has {spec.obs_dim} and {spec.act_dim}")
    return None


@lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    """Top-level module name to the installed distributions that provide it."""
    return dict(importlib.metadata.packages_distributions())


def env_provenance(task: str) -> dict[str, str]:
    """What a ``gymnasium:`` task's results depend on besides its scenes: the Gymnasium id,
    the package that provides the environment and its version, and Gymnasium's version (read
    where the task's environments are built)."""
    rest = task.removeprefix(f"{PREFIX}:")
    return dict(facts_of(rest, _FIRST_KWARGS.get(rest) or {})["provenance"])


def _provenance_here(env_id: str) -> dict[str, str]:
    gym = _gymnasium()
    entry = gym.spec(env_id).entry_point
    module = entry.partition(":")[0] if isinstance(entry, str) else entry.__module__
    top = module.split(".")[0]
    dists = _distributions().get(top, [])
    package = dists[0] if dists else top
    version = importlib.metadata.version(package) if dists else "unversioned"
    return {"env_id": env_id, "package": package, "version": version,
            "gymnasium": importlib.metadata.version("gymnasium")}


def main(argv: list[str] | None = None) -> int:
    """``python -m stages.sim.backends.gymnasium_tasks describe ID [KWARGS_JSON_LIST]``: one JSON
    line, the list of :func:`probe` of ``ID`` under each make_kwargs (default: one, none)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m stages.sim.backends.gymnasium_tasks")
    parser.add_argument("command", choices=("describe",))
    parser.add_argument("id")
    parser.add_argument("kwargs", nargs="?", default="[{}]")
    args = parser.parse_args(argv)
    try:
        sets = json.loads(args.kwargs)
        print(json.dumps([probe(args.id, dict(k)) for k in sets]))
    except (GymEnvError, BackendUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
