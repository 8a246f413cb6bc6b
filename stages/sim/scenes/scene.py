"""Scene and suite configs, loaded from YAML, and their resolved forms.

A scene (``sim_scenes/<task>/<scene>.yaml``) is a registered task plus randomization plus an
episode length. A scene of a Gymnasium task (``gymnasium:<EnvId>``) names instead the
environment's ``make_kwargs`` (its randomization) and a success predicate. A suite lists scenes
with episode counts and fixed seeds; its digest covers the scene files, the task's asset bytes
and the simulator version (for a Gymnasium task also the environment id, the package providing
it and its version, and every scene's make_kwargs), so a success rate is always tied to the
exact simulator revision that produced it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from physai_core.errors import ConfigError, PhysaiError, Problem, UnknownNameError
from stages.core.environments import EnvironmentMissingError
from stages.core.hashing import sha256_file, sha256_json
from stages.core.limits import MAX_EPISODE_STEPS, MAX_SWEEP_POINTS, MAX_WORLDS, at_most, worlds_cost
from stages.core.loading import load_model, named_by, read_yaml
from stages.core.schema import DocumentedModel
from stages.sim.backends import gymnasium_tasks as gym_task
from stages.sim.backends.catalog import backend_version, get_backend
from stages.sim.tasks.catalog import TaskSpec, get_task


def _registered(code: str, lookup: Callable[[str], object]) -> Callable[[str], str]:
    """A validator that returns a name ``lookup`` knows, or fails listing the valid ones."""

    def check(name: str) -> str:
        try:
            lookup(name)
        except UnknownNameError as exc:
            raise PydanticCustomError(code, str(exc)) from None
        return name

    return check


TaskId = Annotated[str, AfterValidator(_registered("unknown_task", get_task))]
"""A registered task id, e.g. ``reach-v0``."""

BackendName = Annotated[str, AfterValidator(_registered("unknown_backend", get_backend))]
"""A registered simulator backend, e.g. ``mujoco``."""


Channel = Annotated[float, Field(ge=0.0, le=1.0)]
"""One colour channel, 0..1."""

Colour = tuple[Channel, Channel, Channel]
"""An RGB colour, each channel 0..1."""


def _ordered_colours(box: tuple[Colour, Colour]) -> tuple[Colour, Colour]:
    """A colour box's low colour is at most its high colour in every channel."""
    low, high = box
    if any(lo > hi for lo, hi in zip(low, high, strict=True)):
        raise PydanticCustomError("colour_box", "needs low <= high in every channel")
    return box


ColourBox = Annotated[tuple[Colour, Colour], AfterValidator(_ordered_colours)]
"""A box of RGB colours: ``[[r, g, b] low, [r, g, b] high]``, each channel 0..1."""

LOOK_DEFAULTS: dict[str, object] = {
    "light_intensity_scale": (1.0, 1.0), "light_direction_jitter": 0.0, "geom_colours": {},
    "camera_pos_jitter": 0.0, "camera_angle_jitter": 0.0, "image_noise_std": 0.0}
"""The visual fields of a scene's randomization and their values when unset: a scene that
leaves them all so draws and renders as one without them."""

CAMERA_FIELDS = ("camera_pos_jitter", "camera_angle_jitter", "image_noise_std")
"""Visual fields that act on the task's cameras."""


class RandomizationConfig(DocumentedModel):
    """Domain randomization of a scene, drawn independently per world at every reset.

    Each ``*_scale`` is a range ``(low, high)`` of multiplicative factors drawn uniformly, one
    factor per body, joint or actuator; ``(1.0, 1.0)`` leaves the nominal model unchanged.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    target_low: tuple[float, ...] = Field(min_length=1, max_length=3)
    """Lower corner of the box the task's target is drawn from uniformly, in the task's target
    units: a point (m, world frame) for reach-v0, a velocity command (forward m/s, lateral m/s,
    yaw rate rad/s, base frame) for locomotion-v0; one coordinate per target axis of the task
    (a planar arm's: x and y)."""
    target_high: tuple[float, ...] = Field(min_length=1, max_length=3)
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
    light_intensity_scale: tuple[float, float] = (1.0, 1.0)
    """Range of factors (dimensionless), one drawn per world, on the ambient, diffuse and
    specular colour of every light of the model and of the headlight: 0.5 halves the light a
    camera sees."""
    light_direction_jitter: float = Field(0.0, ge=0.0, le=90.0)
    """Largest tilt (deg) of each light's direction, drawn per light and world: an angle
    uniform in [0, this] towards a uniformly random side."""
    geom_colours: dict[str, ColourBox] = Field(default_factory=dict)
    """Colours of named geoms of the model, ``{table: [[r, g, b], [r, g, b]]}``: each channel
    (0..1) drawn uniformly per world between the low and the high colour; alpha is kept.
    Applied over the task's own colours (a scene's colour of a geom wins)."""
    camera_pos_jitter: float = Field(0.0, ge=0.0, le=1.0)
    """Largest offset (m) of each of the task's cameras along each world axis, drawn uniformly
    in [-this, this] per axis, camera and world."""
    camera_angle_jitter: float = Field(0.0, ge=0.0, le=90.0)
    """Largest rotation (deg) of each of the task's cameras, drawn per camera and world: an
    angle uniform in [0, this] about an axis of uniformly random direction."""
    image_noise_std: float = Field(0.0, ge=0.0, le=255.0)
    """Standard deviation (intensity levels of 0..255) of zero-mean Gaussian noise added to
    every channel of every pixel of every camera image the policy reads, then rounded and
    clipped to 0..255; depth images get none."""

    @field_validator(
        "mass_scale", "damping_scale", "friction_scale", "gain_scale", "contact_friction_scale",
        "light_intensity_scale",
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

    def looks(self) -> tuple[str, ...]:
        """The visual fields (light, colours, camera pose, image noise) this scene sets."""
        return tuple(name for name, unset in LOOK_DEFAULTS.items()
                     if getattr(self, name) != unset)

    @field_validator("target_high")
    @classmethod
    def _ordered_box(cls, value: tuple[float, ...], info: ValidationInfo) -> tuple[float, ...]:
        """The target box must have target_low <= target_high on every axis."""
        low = info.data.get("target_low")
        if low is not None and len(low) != len(value):
            raise PydanticCustomError(
                "target_box", "has {high} coordinates, target_low {low}",
                {"high": len(value), "low": len(low)}
            )
        if low is not None and any(lo > hi for lo, hi in zip(low, value, strict=True)):
            raise PydanticCustomError(
                "target_box", "must be >= target_low {low} on every axis", {"low": low}
            )
        return value


class SuccessConfig(DocumentedModel):
    """The success predicate of a Gymnasium scene: exactly one of ``{survive: true}``,
    ``{info: KEY}``, ``{info: KEY, min: X}`` / ``{info: KEY, max: X}`` or ``{min_return: X}``."""

    model_config = ConfigDict(allow_inf_nan=False)

    survive: Literal[True] | None = None
    """True: success is not being terminated before the episode's time limit."""
    info: str | None = Field(None, min_length=1)
    """Key of the environment's info: success is its value at the episode's end (where the
    world ended, if it ended early) being truthy, or within ``min`` and ``max``."""
    min: float | None = None
    """With ``info``: the info value must be at least this (in the value's unit)."""
    max: float | None = None
    """With ``info``: the info value must be at most this (in the value's unit)."""
    min_return: float | None = None
    """Success is the episode's summed reward reaching at least this."""

    @model_validator(mode="after")
    def _one_predicate(self) -> SuccessConfig:
        """Exactly one predicate; min and max only with info, ordered."""
        named = [k for k in ("survive", "info", "min_return") if getattr(self, k) is not None]
        if len(named) != 1:
            raise PydanticCustomError(
                "success", "needs exactly one predicate, not {named}: {help}",
                {"named": ", ".join(named) or "none", "help": gym_task.SUCCESS_HELP})
        if self.info is None and (self.min is not None or self.max is not None):
            raise PydanticCustomError("success", "min and max bound an info value: add info")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise PydanticCustomError("success", "needs min <= max")
        return self


class SceneConfig(DocumentedModel):
    """One simulation scene: a task, its randomization and its episode length.

    A MuJoCo task's scene needs ``randomization``; a Gymnasium task's scene takes
    ``make_kwargs`` and a ``success`` predicate instead.
    """

    model_config = ConfigDict(populate_by_name=True, allow_inf_nan=False)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Scene name, unique within a suite; reports are keyed by it and its videos are files named
    after it, so it is letters, digits, ``_``, ``.`` and ``-``, starting with a letter or digit."""
    task: TaskId
    """Registered task id, e.g. ``reach-v0``."""
    episode_steps: int = Field(gt=0)
    """Episode length in control steps (count, at most 100,000); divide by the task's control
    rate for seconds."""
    randomization_: RandomizationConfig | None = Field(None, alias="randomization")
    """Domain randomization drawn per world at every reset (MuJoCo tasks; required there)."""
    make_kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    """Gymnasium tasks: keyword arguments of the environment's ``gymnasium.make`` (its
    randomization, e.g. ``reset_noise_scale``); never the time limit or render mode."""
    success: SuccessConfig | None = None
    """Gymnasium tasks (required there): the success predicate of an episode."""
    description: str = ""
    """Free text: what condition the scene models."""
    sweep: dict[str, list[float]] = Field(default_factory=dict)
    """MuJoCo tasks: randomization fields swept over a grid, e.g. ``{friction_scale: [0.4,
    0.6, 0.8, 1.0]}``: every point of the grid (every combination, when several fields are
    swept) is validated as well, the field held at that value, and the report plots the
    success curve. The scene itself is validated and gated as if it had no sweep."""

    @field_validator("episode_steps")
    @classmethod
    def _bounded_episode(cls, value: int, info: ValidationInfo) -> int:
        """At most :data:`~stages.core.limits.MAX_EPISODE_STEPS`, said in the task's seconds."""
        task = info.data.get("task")
        hz = get_task(task).control_hz if isinstance(task, str) else None
        seconds = f", {value / hz:,.0f} s at {task}'s {hz:g} Hz" if hz else ""
        at_most(value, MAX_EPISODE_STEPS, f"an episode of {value:,} control steps{seconds}, "
                "recorded step by step in every world")
        return value

    @field_validator("sweep")
    @classmethod
    def _sweepable(cls, value: dict[str, list[float]],
                   info: ValidationInfo) -> dict[str, list[float]]:
        """Only numeric randomization fields, each over at least one distinct value that the
        field itself admits, and at most :data:`~stages.core.limits.MAX_SWEEP_POINTS` points."""
        for name, points in value.items():
            if name not in SWEEPABLE:
                raise PydanticCustomError(
                    "sweep", "cannot sweep {name}; sweepable: {valid}",
                    {"name": name, "valid": ", ".join(SWEEPABLE)})
            if not points or len(set(points)) != len(points):
                raise PydanticCustomError("sweep", "{name}: needs distinct values, at least one",
                                          {"name": name})
        grid = math.prod(len(points) for points in value.values())
        at_most(grid, MAX_SWEEP_POINTS, f"a grid of {grid:,} points, each a whole validation "
                "of the scene")
        rand = info.data.get("randomization_")
        if isinstance(rand, RandomizationConfig):
            base = rand.model_dump()
            for name, points in value.items():
                for point in points:
                    try:
                        RandomizationConfig.model_validate(_held(base, name, point))
                    except ValidationError as error:
                        why = error.errors()[0]["msg"]
                        raise PydanticCustomError(
                            "sweep", "{name}: {point} is not a value of {name} ({why})",
                            {"name": name, "point": point, "why": why}) from None
        return value

    def sweep_points(self) -> list[dict[str, float]]:
        """Every point of the sweep's grid, in the order its fields and values are listed."""
        import itertools

        names = list(self.sweep)
        if not names:
            return []
        return [dict(zip(names, combo, strict=True))
                for combo in itertools.product(*(self.sweep[n] for n in names))]

    @property
    def randomization(self) -> RandomizationConfig:
        """The MuJoCo domain randomization; an error for a scene that has none."""
        if self.randomization_ is None:
            raise PhysaiError(f"scene {self.name!r} of task {self.task!r} has no MuJoCo "
                              "randomization")
        return self.randomization_


SWEEPABLE = ("mass_scale", "payload_mass", "damping_scale", "friction_scale", "gain_scale",
             "contact_friction_scale", "obs_noise_std", "action_delay_steps",
             "light_intensity_scale", "light_direction_jitter", "camera_pos_jitter",
             "camera_angle_jitter", "image_noise_std")
"""Randomization fields a scene may sweep: a ``(low, high)`` range is held at the point's
value, a number set to it."""

_SWEPT_NUMBERS = frozenset({"obs_noise_std", "light_direction_jitter", "camera_pos_jitter",
                            "camera_angle_jitter", "image_noise_std"})
"""Sweepable fields that are one number (the others but ``action_delay_steps``, a count, are
ranges)."""


def _held(rand: dict[str, Any], name: str, value: float) -> dict[str, Any]:
    """The randomization fields ``rand`` with the swept field ``name`` held at ``value``: a
    range as ``(value, value)``, a number as itself, a count as an int."""
    held = int(value) if name == "action_delay_steps" else (
        float(value) if name in _SWEPT_NUMBERS else (float(value), float(value)))
    return rand | {name: held}


def sweep_variant(scene: Scene, point: dict[str, float]) -> Scene:
    """``scene`` with each swept field held at ``point``'s value (its sweep removed)."""
    rand = scene.config.randomization.model_dump()
    for name, value in point.items():
        rand = _held(rand, name, value)
    config = scene.config.model_copy(update={
        "randomization_": RandomizationConfig.model_validate(rand), "sweep": {}})
    return Scene(config=config, path=scene.path)


def point_label(point: dict[str, float]) -> str:
    """A sweep point in words: ``friction_scale=0.4``."""
    return ", ".join(f"{k}={v:g}" for k, v in point.items())


class SuiteEntry(DocumentedModel):
    """One scene of a suite, with how many episodes to run and the seed they start from."""

    scene: str = Field(min_length=1)
    """Path of the scene YAML, relative to the suite file."""
    episodes: int = Field(gt=0)
    """Episodes (count, at most 65,536) to run in this scene; they run as that many worlds at
    once."""
    seed: int = Field(ge=0)
    """Seed of the scene's random generator; fixes every randomization draw."""

    @field_validator("episodes")
    @classmethod
    def _bounded_episodes(cls, value: int) -> int:
        """At most :data:`~stages.core.limits.MAX_WORLDS`: a scene's episodes are its worlds."""
        at_most(value, MAX_WORLDS, f"a scene's episodes run as that many worlds at once; "
                f"{worlds_cost(value)}")
        return value


class RemoteInputsConfig(DocumentedModel):
    """How the suite's observations go to a policy served over OpenPI's websocket protocol
    (``flows validate ws://...``, ``flows compare``; stages/policies/remote.py). Without it the keys
    are the server's own (this project's servers state them), else OpenPI's
    (:func:`stages.policies.remote.default_keys`)."""

    keys: dict[str, str] = Field(default_factory=dict)
    """The message key of a policy input (``obs``, ``<camera>_image``), e.g.
    ``{obs: observation/state, front_image: observation/image}``; over the default keys."""
    prompt: str | None = None
    """The instruction sent beside every observation as ``prompt``."""

    @field_validator("keys")
    @classmethod
    def _named(cls, value: dict[str, str]) -> dict[str, str]:
        """Every key is a non-empty message key."""
        empty = sorted(name for name, key in value.items() if not key.strip())
        if empty:
            raise PydanticCustomError("empty_key", "no message key for {inputs}",
                                      {"inputs": ", ".join(empty)})
        return value


class SuiteConfig(DocumentedModel):
    """A frozen list of scenes that a policy is validated on."""

    name: str = Field(min_length=1)
    """Suite name."""
    task: TaskId
    """Registered task id that every scene of the suite must use."""
    backend: BackendName = "mujoco"
    """Registered simulator backend that runs the suite (stages/sim/backends/catalog.py)."""
    compare_backend: BackendName | None = None
    """A second backend that runs every scene too, for a sim-to-sim check: the report shows
    both rates side by side and tests their difference (``validate.sim_to_sim``)."""
    scenes: list[SuiteEntry] = Field(min_length=1)
    """The scenes, each listed once."""
    remote: RemoteInputsConfig | None = None
    """The keys and prompt a policy served over the network is sent the observations with;
    what a policy reads and the suite's digest do not depend on it."""

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
        """A variant of this scene with some fields replaced, validated again; never mutates.

        ``randomization`` fields apply to MuJoCo scenes only.
        """
        update: dict[str, object] = {}
        if randomization:
            update["randomization"] = RandomizationConfig.model_validate(
                self.config.randomization.model_dump() | randomization
            )
        if episode_steps is not None:
            update["episode_steps"] = episode_steps
        config = SceneConfig.model_validate(self.config.model_dump(by_alias=True) | update)
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

    @property
    def backends(self) -> tuple[str, ...]:
        """The backend, then the sim-to-sim one when the suite names it."""
        second = self.config.compare_backend
        return (self.config.backend,) if second is None else (self.config.backend, second)

    @property
    def sweeps(self) -> tuple[tuple[int, dict[str, float]], ...]:
        """Every sweep point of the suite: the index of its scene, and the point."""
        return tuple((i, point) for i, s in enumerate(self.scenes)
                     for point in s.scene.config.sweep_points())

    @property
    def runs(self) -> int:
        """Scene validations: every scene on every backend of :attr:`backends`, then every
        sweep point (on the first backend)."""
        return len(self.scenes) * len(self.backends) + len(self.sweeps)

    def run(self, index: int) -> tuple[str, SuiteScene]:
        """Validation ``index`` of :attr:`runs`: the backend, then the scene (every scene on
        the first backend, then every scene on the second, then every sweep point: its
        scene with the swept fields held at the point's values, same episodes and seed)."""
        plain = len(self.scenes) * len(self.backends)
        if index >= plain:
            scene, point = self.sweeps[index - plain]
            entry = self.scenes[scene]
            return self.backends[0], SuiteScene(sweep_variant(entry.scene, point),
                                                entry.episodes, entry.seed)
        backend, scene = divmod(index, len(self.scenes))
        return self.backends[backend], self.scenes[scene]

    def sweep_point(self, index: int) -> dict[str, float] | None:
        """The sweep point validation ``index`` runs, or None for a plain one."""
        plain = len(self.scenes) * len(self.backends)
        return None if index < plain else self.sweeps[index - plain][1]


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
                                f"a Gymnasium task needs {gym_task.SUCCESS_HELP}"))
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


def _task_problems(config: SceneConfig, path: Path) -> list[Problem]:
    """Problems between a scene and its task: targets outside the task's workspace, pushes on
    a fixed base, and model files the task needs but cannot find; for a Gymnasium task, see
    :func:`_gym_problems`."""
    spec = get_task(config.task)
    if gym_task.is_gym_task(config.task):
        return _gym_problems(config, path)
    if spec.environment is not None:
        return _predicate_problems(config, path, spec)
    problems = [
        Problem(str(path), field, value, f"only Gymnasium tasks take {field}; {spec.name!r} "
                f"judges success itself: {spec.success_tolerance}")
        for field, value in (("make_kwargs", config.make_kwargs or None),
                             ("success", config.success)) if value is not None
    ]
    rand = config.randomization_
    if rand is None:
        problems.append(Problem(str(path), "randomization", None,
                                f"Field required: {spec.name!r} needs its randomization"))
        return problems
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
    problems.extend(_look_problems(rand, path, spec))
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


def load_scene(path: str | Path) -> Scene:
    """Load and check a scene YAML; every problem raises one ConfigError naming file and field.

    Nothing is simulated: the checks read the YAML and the task registry, and look for the
    task's asset files; a Gymnasium scene's make_kwargs are tried by building the environment
    once.
    """
    path = Path(path)
    config = load_model(SceneConfig, path)
    problems = _task_problems(config, path)
    if problems:
        raise ConfigError(problems)
    return Scene(config=config, path=path)


def gym_provenance(task: str, make_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What a scene's results depend on beyond its file and assets, for a digest: for a
    Gymnasium task the environment id, its providing package and version, Gymnasium's version
    and the make_kwargs; nothing (an empty dict) for other tasks."""
    if not gym_task.is_gym_task(task):
        return {}
    return {"gymnasium": {**gym_task.env_provenance(task), "make_kwargs": make_kwargs}}


def scene_provenance(path: Path) -> dict[str, Any]:
    """:func:`gym_provenance` of the scene file ``path`` (read as YAML, not checked)."""
    raw = read_yaml(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("task"), str):
        return {}
    kwargs = raw.get("make_kwargs")
    return gym_provenance(raw["task"], kwargs if isinstance(kwargs, dict) else {})


def suite_digest(
    task: str, backend: str, scenes: tuple[SuiteScene, ...], asset_files: tuple[Path, ...],
    compare_backend: str | None = None,
) -> str:
    """Hex sha256 pinning a suite: task id, backend and its version (and the sim-to-sim
    backend's), asset bytes, scene files, episodes and seeds (and, for a Gymnasium task,
    :func:`gym_provenance` of every scene). Assets are keyed by file name, so the digest does
    not depend on where the repository is checked out."""
    second = {} if compare_backend is None else {
        "compare_backend": compare_backend,
        "compare_backend_version": backend_version(compare_backend)}
    return sha256_json(
        {
            "task": task,
            "backend": backend,
            "backend_version": backend_version(backend),
            **second,
            "assets": {p.name: sha256_file(p) for p in asset_files},
            "scenes": [
                {
                    "name": s.scene.name,
                    "sha256": sha256_file(s.scene.path),
                    "episodes": s.episodes,
                    "seed": s.seed,
                    **({"sweep": s.scene.config.sweep} if s.scene.config.sweep else {}),
                    **gym_provenance(task, dict(s.scene.config.make_kwargs)),
                }
                for s in scenes
            ],
        }
    )


def _remote_problems(path: Path, remote: RemoteInputsConfig, task: TaskSpec) -> list[Problem]:
    """A key of ``remote.keys`` that names no input of ``task``: the state ``obs`` or one of
    its cameras' tensors."""
    inputs = ["obs", *(key for camera in task.cameras for key in camera.tensors())]
    return [Problem(str(path), f"remote.keys.{name}", key,
                    f"names no input of task {task.name!r}; its inputs: {', '.join(inputs)}")
            for name, key in remote.keys.items() if name not in inputs]


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
            problems.extend(_unseen_look(path, field_name, name, resolved))
    if config.remote is not None:
        problems.extend(_remote_problems(path, config.remote, task))
    if config.compare_backend is not None and config.compare_backend == config.backend:
        problems.append(Problem(str(path), "compare_backend", config.compare_backend,
                                "is the suite's backend; name a second one"))
    if problems:
        raise ConfigError(problems)
    scenes = tuple(resolved)
    spec = get_task(config.task)
    try:
        digest = suite_digest(config.task, config.backend, scenes, spec.asset_files,
                              config.compare_backend)
    except EnvironmentMissingError as exc:
        raise EnvironmentMissingError(f"{path}: backend: {exc}") from None
    return Suite(config=config, path=path, scenes=scenes, digest=digest)
