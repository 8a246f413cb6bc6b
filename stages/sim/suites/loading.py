"""Loading scene and suite files: read, check against the task and backend registries, resolve.

:func:`load_scene` and :func:`load_suite` are the only way from a file to a
:class:`~stages.sim.scenes.scene.Scene` or a :class:`~stages.sim.suites.suite.Suite`: each
reads the YAML with the task registry's lookup in force
(:func:`~stages.sim.scenes.scene.tasks_from`), checks what the registries know
(:mod:`stages.sim.suites.checks`), and raises every problem found as one ConfigError naming
file, field and value (exit status 2). Nothing is simulated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from physai_core.errors import ConfigError, Problem
from stages.core.environments import EnvironmentMissingError
from stages.core.loading import load_model, named_by, read_yaml
from stages.sim.scenes.scene import Scene, SceneConfig, tasks_from
from stages.sim.suites.checks import scene_problems, suite_problems
from stages.sim.suites.digest import suite_digest
from stages.sim.suites.suite import Suite, SuiteConfig, SuiteScene
from stages.sim.tasks.catalog import get_task


def load_scene(path: str | Path) -> Scene:
    """Load and check a scene YAML; every problem raises one ConfigError naming file and field.

    Nothing is simulated: the checks read the YAML and the task registry, and look for the
    task's asset files; a Gymnasium scene's make_kwargs are tried by building the environment
    once.
    """
    path = Path(path)
    _offer_make_kwargs(path)
    with tasks_from(get_task):
        config = load_model(SceneConfig, path)
    problems = scene_problems(config, path)
    if problems:
        raise ConfigError(problems)
    return Scene(config=config, path=path)


def _offer_make_kwargs(path: Path) -> None:
    """Offer a Gymnasium scene's make_kwargs to its task before the task is looked up: the
    first scene loaded decides how the environment is probed (Meta-World/MT1 needs its
    env_name). The file is read as plain YAML; its checks come after."""
    from stages.sim.backends import gymnasium_tasks

    raw = _raw(path)
    kwargs = raw.get("make_kwargs")
    if isinstance(raw.get("task"), str) and isinstance(kwargs, dict):
        gymnasium_tasks.offer_make_kwargs(raw["task"], kwargs)


def _raw(path: Path) -> dict[str, Any]:
    try:
        raw = read_yaml(path)
    except (ConfigError, OSError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _prefetch(path: Path) -> None:
    """Probe a Gymnasium suite's task under every scene's make_kwargs at once (one interpreter
    for all where the task lives in a stage environment)."""
    from stages.sim.backends import gymnasium_tasks

    raw = _raw(path)
    task, scenes = raw.get("task"), raw.get("scenes")
    if not isinstance(task, str) or not gymnasium_tasks.is_gym_task(task) \
            or not isinstance(scenes, list):
        return
    sets = []
    for entry in scenes:
        named = entry.get("scene") if isinstance(entry, dict) else None
        scene = _raw(path.parent / named) if isinstance(named, str) else {}
        kwargs = scene.get("make_kwargs", {})
        if isinstance(kwargs, dict):
            sets.append(kwargs)
            gymnasium_tasks.offer_make_kwargs(task, kwargs)
    if gymnasium_tasks.environment_of(task) is not None:
        gymnasium_tasks.prefetch(task, sets)


def load_suite(path: str | Path) -> Suite:
    """Load a suite YAML and every scene it lists; all problems found raise one ConfigError.

    1. Read the suite file, its task and backends checked against the registries.
    2. Load every scene it lists (:func:`_suite_scenes`).
    3. Check the suite against its backends and remote inputs
       (:func:`~stages.sim.suites.checks.suite_problems`); raise every problem found.
    4. Pin what it measures by its digest (:func:`~stages.sim.suites.digest.suite_digest`).
    """
    # -- 1. the suite file
    path = Path(path)
    _prefetch(path)
    with tasks_from(get_task):
        config = load_model(SuiteConfig, path)
    # -- 2. its scenes
    resolved, problems = _suite_scenes(path, config)
    # -- 3. its backends and remote inputs
    problems.extend(suite_problems(path, config, resolved))
    if problems:
        raise ConfigError(problems)
    # -- 4. its digest
    scenes = tuple(resolved)
    spec = get_task(config.task)
    try:
        digest = suite_digest(config.task, config.backend, scenes, spec.asset_files,
                              config.compare_backend)
    except EnvironmentMissingError as exc:
        raise EnvironmentMissingError(f"{path}: backend: {exc}") from None
    return Suite(config=config, path=path, scenes=scenes, digest=digest)


def _suite_scenes(path: Path, config: SuiteConfig) -> tuple[list[SuiteScene], list[Problem]]:
    """The scenes the suite file ``path`` lists, loaded, and every problem found: a scene file
    missing or bad, a scene of another task, a scene name used twice."""
    problems: list[Problem] = []
    resolved: list[SuiteScene] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(config.scenes):
        field = f"scenes.{i}.scene"
        scene_path = path.parent / entry.scene
        if not scene_path.is_file():
            problems.append(
                Problem(str(path), field, entry.scene, f"scene file not found: {scene_path}")
            )
            continue
        try:
            with named_by(path):
                scene = load_scene(scene_path)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        if scene.config.task != config.task:
            problems.append(
                Problem(
                    str(scene_path),
                    "task",
                    scene.config.task,
                    f"differs from the task {config.task!r} of suite {path}",
                )
            )
        if scene.name in seen:
            problems.append(
                Problem(
                    str(path),
                    field,
                    entry.scene,
                    f"scene name {scene.name!r} is already used by scenes.{seen[scene.name]}",
                )
            )
        seen.setdefault(scene.name, i)
        resolved.append(SuiteScene(scene, entry.episodes, entry.seed))
    return resolved, problems
