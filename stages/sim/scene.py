"""Scene and suite configs, loaded from YAML, and their resolved forms.

A scene (``sim_scenes/<task>/<scene>.yaml``) is a registered task plus randomization plus an
episode length. A suite lists scenes with episode counts and fixed seeds; its digest covers the
scene files, the task's asset bytes and the simulator version, so a success rate is always tied
to the exact simulator revision that produced it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import mujoco
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from stages.errors import ConfigError, Problem, UnknownNameError
from stages.hashing import sha256_file, sha256_json
from stages.schema import FrozenModel, load_model
from stages.sim.tasks import Vec3, get_task


def _known_task(name: str) -> str:
    """Return ``name`` if it is a registered task; otherwise fail, listing the valid ids."""
    try:
        get_task(name)
    except UnknownNameError as exc:
        raise PydanticCustomError("unknown_task", str(exc)) from None
    return name


TaskId = Annotated[str, AfterValidator(_known_task)]
"""A registered task id, e.g. ``reach-v0``."""


class RandomizationConfig(FrozenModel):
    """Domain randomization of a scene, drawn independently per world at every reset.

    Each ``*_scale`` is a range ``(low, high)`` of multiplicative factors drawn uniformly, one
    factor per body, joint or actuator; ``(1.0, 1.0)`` leaves the nominal model unchanged.
    """

    model_config = ConfigDict(use_attribute_docstrings=True, allow_inf_nan=False)

    target_low: Vec3
    """Lower corner of the box the task's target is drawn from uniformly, in the task's target
    units: a point (m, world frame) for reach-v0, a velocity command (forward m/s, lateral m/s,
    yaw rate rad/s, base frame) for locomotion-v0."""
    target_high: Vec3
    """Upper corner of the box the task's target is drawn from uniformly, in the task's target
    units."""
    mass_scale: tuple[float, float] = (1.0, 1.0)
    """Range of factors (dimensionless) on each moving body's mass and inertia; a robot's
    gravity compensation keeps using the nominal masses."""
    payload_mass: tuple[float, float] = (0.0, 0.0)
    """Range (kg) of the extra mass added to the task's payload body (reach-v0: the last link,
    locomotion-v0: the torso), its inertia scaled by the same mass ratio."""
    damping_scale: tuple[float, float] = (1.0, 1.0)
    """Range of factors (dimensionless) on each joint's viscous damping."""
    friction_scale: tuple[float, float] = (1.0, 1.0)
    """Range of factors (dimensionless) on each joint's dry friction (frictionloss)."""
    gain_scale: tuple[float, float] = (1.0, 1.0)
    """Range of factors (dimensionless) on each position actuator's stiffness kp."""
    contact_friction_scale: tuple[float, float] = (1.0, 1.0)
    """Range of factors (dimensionless) on the sliding friction of every contact: one factor
    per world, applied to every geom."""
    obs_noise_std: float = Field(0.0, ge=0.0)
    """Standard deviation of zero-mean Gaussian noise added to every observation entry (in
    that entry's unit)."""
    action_delay_steps: int = Field(0, ge=0)
    """Control steps (count) between an action being chosen and being applied."""
    push_velocity: tuple[float, float] = (0.0, 0.0)
    """Range (m/s) of the size of each push: a horizontal velocity of uniformly random
    direction added at once to a floating base. Needs push_interval_steps."""
    push_interval_steps: tuple[int, int] | None = Field(None, validate_default=True)
    """Range (control steps) of the time to a world's next push, drawn uniformly, first from
    the episode's start; None: no pushes."""

    @field_validator(
        "mass_scale", "damping_scale", "friction_scale", "gain_scale", "contact_friction_scale"
    )
    @classmethod
    def _positive_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        """A scale range must be positive and ordered."""
        low, high = value
        if not 0.0 < low <= high:
            raise PydanticCustomError(
                "scale_range", "a scale range (low, high) needs 0 < low <= high"
            )
        return value

    @field_validator("payload_mass", "push_velocity")
    @classmethod
    def _non_negative_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        """A payload or push range must be non-negative and ordered."""
        low, high = value
        if not 0.0 <= low <= high:
            raise PydanticCustomError("range", "a range (low, high) needs 0 <= low <= high")
        return value

    @field_validator("push_interval_steps")
    @classmethod
    def _interval_range(
        cls, value: tuple[int, int] | None, info: ValidationInfo
    ) -> tuple[int, int] | None:
        """A push interval is at least one control step, ordered, and set with push_velocity."""
        pushing = info.data.get("push_velocity", (0.0, 0.0)) != (0.0, 0.0)
        if pushing and value is None:
            raise PydanticCustomError(
                "pushes", "needed when push_velocity is above zero: control steps between pushes"
            )
        if value is None:
            return value
        if not pushing:
            raise PydanticCustomError("pushes", "pushes need push_velocity above zero")
        if not 1 <= value[0] <= value[1]:
            raise PydanticCustomError(
                "interval_range", "a push interval (low, high) needs 1 <= low <= high"
            )
        return value

    @field_validator("target_high")
    @classmethod
    def _ordered_box(cls, value: Vec3, info: ValidationInfo) -> Vec3:
        """The target box must have target_low <= target_high on every axis."""
        low = info.data.get("target_low")
        if low is not None and any(lo > hi for lo, hi in zip(low, value, strict=True)):
            raise PydanticCustomError(
                "target_box", "must be >= target_low {low} on every axis", {"low": low}
            )
        return value


class SceneConfig(FrozenModel):
    """One simulation scene: a task, its randomization and its episode length."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Scene name, unique within a suite; reports are keyed by it and its videos are files named
    after it, so it is letters, digits, ``_``, ``.`` and ``-``, starting with a letter or digit."""
    task: TaskId
    """Registered task id, e.g. ``reach-v0``."""
    episode_steps: int = Field(gt=0)
    """Episode length in control steps (count); divide by the task's control rate for seconds."""
    randomization: RandomizationConfig
    """Domain randomization drawn per world at every reset."""
    description: str = ""
    """Free text: what condition the scene models."""


class SuiteEntry(FrozenModel):
    """One scene of a suite, with how many episodes to run and the seed they start from."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    scene: str = Field(min_length=1)
    """Path of the scene YAML, relative to the suite file."""
    episodes: int = Field(gt=0)
    """Episodes (count) to run in this scene."""
    seed: int = Field(ge=0)
    """Seed of the scene's random generator; fixes every randomization draw."""


class SuiteConfig(FrozenModel):
    """A frozen list of scenes that a policy is validated on."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    name: str = Field(min_length=1)
    """Suite name."""
    task: TaskId
    """Registered task id that every scene of the suite must use."""
    backend: Literal["mujoco"] = "mujoco"
    """Simulator backend that runs the suite."""
    scenes: list[SuiteEntry] = Field(min_length=1)
    """The scenes, each listed once."""

    @field_validator("scenes")
    @classmethod
    def _unique_scenes(cls, value: list[SuiteEntry]) -> list[SuiteEntry]:
        """A scene file may be listed only once."""
        paths = [entry.scene for entry in value]
        repeated = sorted({p for p in paths if paths.count(p) > 1})
        if repeated:
            raise PydanticCustomError(
                "repeated_scene",
                "scene files listed more than once: {files}",
                {"files": ", ".join(repeated)},
            )
        return value


@dataclass(frozen=True)
class Scene:
    """A scene config together with the file it was loaded from."""

    config: SceneConfig
    """The validated config."""
    path: Path
    """The scene YAML file."""

    @property
    def name(self) -> str:
        """The scene's name."""
        return self.config.name

    def replace(self, episode_steps: int | None = None, **randomization: object) -> Scene:
        """A variant of this scene with some fields replaced, validated again; never mutates."""
        rand = RandomizationConfig.model_validate(
            self.config.randomization.model_dump() | randomization
        )
        update: dict[str, object] = {"randomization": rand}
        if episode_steps is not None:
            update["episode_steps"] = episode_steps
        config = SceneConfig.model_validate(self.config.model_dump() | update)
        return Scene(config=config, path=self.path)


class SuiteScene(NamedTuple):
    """One resolved entry of a suite: the scene, its episode count and its seed."""

    scene: Scene
    """The loaded scene."""
    episodes: int
    """Episodes (count) to run in the scene."""
    seed: int
    """Seed of the scene's random generator."""


@dataclass(frozen=True)
class Suite:
    """A suite config with every scene loaded, and the digest that pins what it measures."""

    config: SuiteConfig
    """The validated config."""
    path: Path
    """The suite YAML file."""
    scenes: tuple[SuiteScene, ...]
    """The scenes in the order the suite lists them."""
    digest: str
    """Hex sha256 over scene files, asset bytes, episodes, seeds and backend version."""

    @property
    def name(self) -> str:
        """The suite's name."""
        return self.config.name


def _task_problems(config: SceneConfig, path: Path) -> list[Problem]:
    """Problems between a scene and its task: targets outside the task's workspace, pushes on
    a fixed base, and model files the task needs but cannot find."""
    spec = get_task(config.task)
    rand = config.randomization
    problems = []
    units = ", ".join(f"{n} {u}" for n, u in zip(spec.target_names, spec.target_units, strict=True))
    for field, corner in (("target_low", rand.target_low), ("target_high", rand.target_high)):
        if any(
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
    if rand.push_interval_steps is not None and not spec.floating_base:
        problems.append(
            Problem(
                str(path),
                "randomization.push_velocity",
                rand.push_velocity,
                f"{spec.name!r} has a fixed base, which cannot be pushed",
            )
        )
    problems.extend(
        Problem(str(path), "task", config.task, f"asset file of the task not found: {asset}")
        for asset in spec.asset_files
        if not asset.is_file()
    )
    return problems


def load_scene(path: str | Path) -> Scene:
    """Load and check a scene YAML; every problem raises one ConfigError naming file and field.

    Nothing is simulated: the checks read the YAML and the task registry, and look for the
    task's asset files.
    """
    path = Path(path)
    config = load_model(SceneConfig, path)
    problems = _task_problems(config, path)
    if problems:
        raise ConfigError(problems)
    return Scene(config=config, path=path)


def suite_digest(
    task: str, backend: str, scenes: tuple[SuiteScene, ...], asset_files: tuple[Path, ...]
) -> str:
    """Hex sha256 pinning a suite: task id, backend and its version, asset bytes, scene files,
    episodes and seeds. Assets are keyed by file name, so the digest does not depend on where
    the repository is checked out."""
    return sha256_json(
        {
            "task": task,
            "backend": backend,
            "backend_version": mujoco.__version__,
            "assets": {p.name: sha256_file(p) for p in asset_files},
            "scenes": [
                {
                    "name": s.scene.name,
                    "sha256": sha256_file(s.scene.path),
                    "episodes": s.episodes,
                    "seed": s.seed,
                }
                for s in scenes
            ],
        }
    )


def load_suite(path: str | Path) -> Suite:
    """Load a suite YAML and every scene it lists; all problems found raise one ConfigError."""
    path = Path(path)
    config = load_model(SuiteConfig, path)
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
    if problems:
        raise ConfigError(problems)
    scenes = tuple(resolved)
    spec = get_task(config.task)
    digest = suite_digest(config.task, config.backend, scenes, spec.asset_files)
    return Suite(config=config, path=path, scenes=scenes, digest=digest)
