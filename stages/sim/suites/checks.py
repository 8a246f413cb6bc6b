"""What a suite's loading checks against the registries: a scene against its task, a suite
against its backends and its remote inputs.

Each check returns every problem it finds (file, field, value and why), so a suite's loading
reports them all at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from physai_core.errors import Problem
from stages.sim.backends import gymnasium_tasks as gym_task
from stages.sim.backends.catalog import get_backend
from stages.sim.scenes.scene import CAMERA_FIELDS, SUCCESS_HELP, RandomizationConfig, SceneConfig
from stages.sim.suites.suite import RemoteInputsConfig, SuiteConfig, SuiteScene
from stages.sim.tasks.catalog import TaskSpec, get_task


def _gym_problems(config: SceneConfig, path: Path) -> list[Problem]:
    """Problems between a scene and its Gymnasium task: MuJoCo randomization, a missing
    success predicate, and make_kwargs that are reserved or that the environment refuses."""
    problems = []
    if config.sweep:
        problems.append(Problem(str(path), "sweep", config.sweep,
                                "sweeps hold MuJoCo randomization fields; a Gymnasium task "
                                "has none"))
    if config.randomization_ is not None:
        problems.append(Problem(
            str(path), "randomization", config.randomization_.model_dump(),
            f"a Gymnasium task ({config.task}) takes no MuJoCo randomization; randomize "
            "through make_kwargs, the environment's make kwargs"))
    if config.success is None:
        problems.append(Problem(str(path), "success", None,
                                f"a Gymnasium task needs {SUCCESS_HELP}"))
    if config.seed_at_make and "seed" in config.make_kwargs:
        problems.append(Problem(str(path), "make_kwargs.seed", config.make_kwargs["seed"],
                                "seed_at_make gives each world its own seed: remove one"))
    reserved = sorted(gym_task.RESERVED_MAKE_KWARGS & set(config.make_kwargs))
    problems.extend(
        Problem(str(path), f"make_kwargs.{key}", config.make_kwargs[key],
                "set by the pipeline (episode_steps sets the time limit), not by a scene")
        for key in reserved
    )
    if config.make_kwargs and not reserved:
        why = gym_task.make_kwargs_problem(config.task, dict(config.make_kwargs))
        if why is not None:
            problems.append(Problem(str(path), "make_kwargs", config.make_kwargs, why))
    return problems


def _predicate_problems(config: SceneConfig, path: Path, spec: TaskSpec) -> list[Problem]:
    """Problems between a scene and a task that another stage environment runs (Isaac Lab's
    own): it takes a success predicate, and neither MuJoCo randomization nor make_kwargs."""
    problems = []
    if config.sweep:
        problems.append(Problem(str(path), "sweep", config.sweep,
                                f"{spec.name} has no MuJoCo randomization to sweep"))
    if config.randomization_ is not None:
        problems.append(Problem(str(path), "randomization", config.randomization_.model_dump(),
                                f"{spec.name} takes no MuJoCo randomization"))
    if config.make_kwargs:
        problems.append(Problem(str(path), "make_kwargs", config.make_kwargs,
                                f"{spec.name} takes no make_kwargs"))
    if config.success is None:
        problems.append(Problem(str(path), "success", None,
                                f"{spec.name} needs {spec.success_tolerance}"))
    return problems


def scene_problems(config: SceneConfig, path: Path) -> list[Problem]:
    """Problems between a scene and its task, found in four steps:

    1. a Gymnasium task's scene is checked by :func:`_gym_problems`, and one of a task another
       stage environment runs by :func:`_predicate_problems`; a MuJoCo task's scene
    2. takes neither make_kwargs nor success, and needs its randomization,
    3. draws targets inside the task's workspace (:func:`_target_problems`), pushes only a
       floating base and varies an object only where the task grasps one,
    4. finds the task's asset files, and varies only what the task's model and cameras have
       (:func:`_look_problems`).
    """
    # -- 1. tasks that judge success by the scene's predicate
    spec = get_task(config.task)
    if gym_task.is_gym_task(config.task):
        return _gym_problems(config, path)
    if spec.environment is not None:
        return _predicate_problems(config, path, spec)
    # -- 2. a MuJoCo task's fields
    problems = [
        Problem(str(path), field, value, f"only Gymnasium tasks take {field}; {spec.name!r} "
                f"judges success itself: {spec.success_tolerance}")
        for field, value in (("make_kwargs", config.make_kwargs or None),
                             ("success", config.success),
                             ("seed_at_make", config.seed_at_make or None)) if value is not None
    ]
    rand = config.randomization_
    if rand is None:
        problems.append(Problem(str(path), "randomization", None,
                                f"Field required: {spec.name!r} needs its randomization"))
        return problems
    # -- 3. targets in the workspace; pushes on a floating base; objects where there are
    problems.extend(_target_problems(rand, path, spec))
    if rand.push_interval_steps is not None and not spec.floating_base:
        problems.append(
            Problem(
                str(path),
                "randomization.push_velocity",
                rand.push_velocity,
                f"{spec.name!r} has a fixed base, which cannot be pushed",
            )
        )
    if not spec.grasps_objects:
        problems.extend(
            Problem(str(path), f"randomization.{field}", getattr(rand, field),
                    f"{spec.name!r} has no object to grasp (a manipulation task such as "
                    "pick-place-v0 takes it)")
            for field in rand.objects())
    # -- 4. the task's files, and what the scene's looks vary
    problems.extend(
        Problem(str(path), "task", config.task, f"asset file of the task not found: {asset}")
        for asset in spec.asset_files
        if not asset.is_file()
    )
    problems.extend(_look_problems(rand, path, spec))
    return problems


def _target_problems(rand: RandomizationConfig, path: Path, spec: TaskSpec) -> list[Problem]:
    """Corners of a scene's target box that have another number of coordinates than the task's
    targets, or lie outside the task's workspace."""
    problems = []
    units = ", ".join(f"{n} {u}" for n, u in zip(spec.target_names, spec.target_units, strict=True))
    for field, corner in (("target_low", rand.target_low), ("target_high", rand.target_high)):
        if len(corner) != len(spec.target_names):
            problems.append(Problem(str(path), f"randomization.{field}", corner,
                                    f"has {len(corner)} coordinates; the targets of "
                                    f"{spec.name!r} have {len(spec.target_names)} ({units})"))
        elif any(
            not lo <= c <= hi
            for c, lo, hi in zip(corner, spec.workspace_low, spec.workspace_high, strict=True)
        ):
            problems.append(
                Problem(
                    str(path),
                    f"randomization.{field}",
                    corner,
                    f"outside the workspace of {spec.name!r}: "
                    f"{spec.workspace_low} .. {spec.workspace_high} ({units})",
                )
            )
    return problems


def _task_model(spec: TaskSpec) -> Any:
    """The task's MJCF model (its first ``.xml`` asset), compiled; None where it has none or
    it does not compile here (the environment's own load says why)."""
    xml = next((p for p in spec.asset_files if p.suffix == ".xml" and p.is_file()), None)
    if xml is None:
        return None
    try:
        import mujoco

        return mujoco.MjModel.from_xml_path(str(xml))
    except (ImportError, ValueError):
        return None


def _look_problems(rand: RandomizationConfig, path: Path, spec: TaskSpec) -> list[Problem]:
    """Problems between a scene's visual variation and its task: a camera field on a task
    that observes through no camera, a geom colour for a geom its model lacks, and light
    tilts in a model without a light."""
    problems = [
        Problem(str(path), f"randomization.{field}", getattr(rand, field),
                f"{spec.name!r} observes through no camera; only a task's declared cameras "
                "are jittered and noised")
        for field in CAMERA_FIELDS if getattr(rand, field) and not spec.cameras]
    if not (rand.geom_colours or rand.light_direction_jitter):
        return problems
    model = _task_model(spec)
    if model is None:
        return problems
    geoms = sorted({model.geom(i).name for i in range(model.ngeom)} - {""})
    problems.extend(
        Problem(str(path), f"randomization.geom_colours.{name}", [list(c) for c in box],
                f"the model of {spec.name!r} has no geom {name!r}; its named geoms: "
                f"{', '.join(geoms) or 'none'}")
        for name, box in rand.geom_colours.items() if name not in geoms)
    if rand.light_direction_jitter and model.nlight == 0:
        problems.append(Problem(str(path), "randomization.light_direction_jitter",
                                rand.light_direction_jitter,
                                f"the model of {spec.name!r} has no light to tilt"))
    return problems


def _unseen_look(suite: Path, field: str, backend: str,
                 scenes: list[SuiteScene]) -> list[Problem]:
    """Scenes whose visual variation ``backend``, which renders no camera, would draw unseen."""
    if get_backend(backend).renders_cameras:
        return []
    problems = []
    for entry in scenes:
        rand = entry.scene.config.randomization_
        looks = () if rand is None else rand.looks()
        if looks:
            problems.append(Problem(str(suite), field, backend,
                                    f"renders no camera, and scene {entry.scene.name!r} varies "
                                    f"how it looks ({', '.join(looks)})"))
    return problems


def _remote_problems(path: Path, remote: RemoteInputsConfig, task: TaskSpec) -> list[Problem]:
    """A key of ``remote.keys`` that names no input of ``task``: the state ``obs`` or one of
    its cameras' tensors."""
    inputs = ["obs", *(key for camera in task.cameras for key in camera.tensors())]
    return [Problem(str(path), f"remote.keys.{name}", key,
                    f"names no input of task {task.name!r}; its inputs: {', '.join(inputs)}")
            for name, key in remote.keys.items() if name not in inputs]

def suite_problems(path: Path, config: SuiteConfig, scenes: list[SuiteScene]) -> list[Problem]:
    """Problems between a suite and its backends (each renders the cameras the task observes
    through and runs the task; one that renders none, scenes that vary how they look), its
    remote inputs, and a sim-to-sim backend that is the suite's own."""
    problems: list[Problem] = []
    task = get_task(config.task)
    for field_name in ("backend", "compare_backend"):
        name = getattr(config, field_name)
        if name is not None and task.cameras and not get_backend(name).renders_cameras:
            problems.append(Problem(str(path), field_name, name,
                                    f"renders no camera, and task {config.task!r} observes "
                                    f"through {', '.join(c.name for c in task.cameras)}"))
        elif name is not None and not get_backend(name).runs(task):
            problems.append(Problem(str(path), field_name, name,
                                    f"does not run task {config.task!r}; it runs: "
                                    f"{get_backend(name).runnable()}"))
        elif name is not None:
            problems.extend(_unseen_look(path, field_name, name, scenes))
    if config.remote is not None:
        problems.extend(_remote_problems(path, config.remote, task))
    if config.compare_backend is not None and config.compare_backend == config.backend:
        problems.append(Problem(str(path), "compare_backend", config.compare_backend,
                                "is the suite's backend; name a second one"))
    return problems
