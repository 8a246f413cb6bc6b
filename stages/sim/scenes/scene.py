"""Scene data: a scene's config read from YAML, its randomization, and the loaded scene.

A scene (``sim_scenes/<task>/<scene>.yaml``) is a task plus randomization plus an episode
length. A scene of a Gymnasium task (``gymnasium:<EnvId>``) names instead the environment's
``make_kwargs`` (its randomization) and a success predicate. Sweeps hold randomization fields at
each point of a grid (:func:`sweep_variant`).

This module looks up no registry: a scene names its task by id, and the id is checked against
the task registry that the loader passes in (:func:`tasks_from`; the suites layer loads scene
files, :mod:`stages.sim.suites.loading`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

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

from physai_core.errors import PhysaiError, UnknownNameError
from stages.core.limits import MAX_EPISODE_STEPS, MAX_SWEEP_POINTS, at_most
from stages.core.schema import DocumentedModel

SUCCESS_HELP = (
    "the scene's success predicate: {survive: true}, {info: KEY}, {info: KEY, min: X}, "
    "{info: KEY, max: X} or {min_return: X}"
)
"""The success predicates a Gymnasium scene can name, in words."""


class TaskFacts(Protocol):
    """What a scene's checks read of its task (a registered task's spec has it)."""

    @property
    def control_hz(self) -> float:
        """Control rate (Hz) of the task."""
        ...


TaskLookup = Callable[[str], TaskFacts]
"""A task registry's lookup: the task of an id, or an
:class:`~physai_core.errors.UnknownNameError` that lists the valid ids."""

_TASKS: ContextVar[TaskLookup | None] = ContextVar("scene_tasks", default=None)
"""The task lookup that :func:`tasks_from` passed in, while it is in force."""


@contextmanager
def tasks_from(lookup: TaskLookup) -> Iterator[None]:
    """Within: a :data:`TaskId` is checked with ``lookup`` (an unknown id lists the valid ones)
    and a scene's episode bound is said in its task's seconds.

    Outside, a task id is taken as written: the scene data imports no registry, so whoever
    loads scene and suite files passes the registry's lookup in, as
    :func:`stages.core.loading.named_by` passes in the file that names another.
    """
    token = _TASKS.set(lookup)
    try:
        yield
    finally:
        _TASKS.reset(token)


def _known_task(name: str) -> str:
    """A task id the lookup of :func:`tasks_from` knows, or a failure listing the valid ones."""
    lookup = _TASKS.get()
    if lookup is not None:
        try:
            lookup(name)
        except UnknownNameError as exc:
            raise PydanticCustomError("unknown_task", str(exc)) from None
    return name


def _control_hz(task: object) -> float | None:
    """The control rate (Hz) of ``task`` by the lookup of :func:`tasks_from`; None outside it
    or for a task id that failed its check."""
    lookup = _TASKS.get()
    return lookup(task).control_hz if lookup is not None and isinstance(task, str) else None


TaskId = Annotated[str, AfterValidator(_known_task)]
"""A registered task id, e.g. ``reach-v0`` (checked within :func:`tasks_from`)."""


MAX_INSTRUCTION_CHARS = 1000
"""Longest instruction text (characters): a sentence or a paragraph, not a document."""

InstructionText = Annotated[str, Field(min_length=1, max_length=MAX_INSTRUCTION_CHARS)]
"""One instruction: a non-empty text, at most :data:`MAX_INSTRUCTION_CHARS` characters."""


def _distinct_texts(value: str | list[str]) -> str | list[str]:
    """A list of instructions is not empty, and names each text once, each not blank."""
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise PydanticCustomError("instruction", "needs at least one text")
    if any(not text.strip() for text in texts):
        raise PydanticCustomError("instruction", "an instruction is blank")
    repeated = sorted({t for t in texts if texts.count(t) > 1})
    if repeated:
        raise PydanticCustomError("instruction", "lists {texts} more than once",
                                  {"texts": ", ".join(map(repr, repeated))})
    return value


Instruction = Annotated[InstructionText | list[InstructionText],
                        AfterValidator(_distinct_texts)]
"""A scene's instruction: one text, or a list of distinct texts drawn per episode."""

INSTRUCTION_STREAM = 0x1257
"""Mixed into a scene's seed for its instruction draws, so they are a stream of their own
(the simulator's draws from the same seed are left as they were)."""


def episode_instructions(config: SceneConfig, worlds: int, seed: int
                         ) -> tuple[str, ...] | None:
    """The instruction of each of ``worlds`` episodes of the scene ``config`` run from
    ``seed``: its one text for all, or one of its list drawn uniformly per episode from
    ``SeedSequence([seed, INSTRUCTION_STREAM])``; None for a scene without instruction."""
    import numpy as np

    given = config.instruction
    if given is None:
        return None
    if isinstance(given, str):
        return (given,) * worlds
    rng = np.random.default_rng(np.random.SeedSequence([seed, INSTRUCTION_STREAM]))
    return tuple(given[i] for i in rng.integers(0, len(given), worlds))


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

OBJECT_DEFAULTS: dict[str, object] = {
    "object_mass": None, "object_size_scale": (1.0, 1.0), "object_friction_scale": (1.0, 1.0),
    "object_yaw": (0.0, 0.0), "gripper_force_scale": (1.0, 1.0),
    "table_friction_scale": (1.0, 1.0)}
"""The manipulation fields of a scene's randomization (the object a gripper grasps, the gripper
and the table) and their values when unset. Only a task with an object to grasp (lift-v0,
pick-place-v0) takes them; its environment refuses a scene of another task that sets one."""

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
    object_mass: tuple[float, float] | None = None
    """Manipulation tasks: range (kg) of the grasped object's mass, drawn per world, its
    inertia following; None: the task's nominal mass. (``mass_scale`` scales the object too,
    before this replaces its mass.)"""
    object_size_scale: tuple[float, float] = (1.0, 1.0)
    """Manipulation tasks: range of factors (dimensionless) on the object's size, one per
    world, on every side alike; it rests on the table at its new size."""
    object_friction_scale: tuple[float, float] = (1.0, 1.0)
    """Manipulation tasks: range of factors (dimensionless) on the sliding friction of the
    object's surface, one per world (after ``contact_friction_scale``)."""
    object_yaw: tuple[float, float] = (0.0, 0.0)
    """Manipulation tasks: range (rad) of the object's initial rotation about the vertical,
    drawn per world; its initial position is the scene's target box."""
    gripper_force_scale: tuple[float, float] = (1.0, 1.0)
    """Manipulation tasks: range of factors (dimensionless) on the gripper's force limit, one
    per world: below 1 the fingers squeeze less and a heavy object can slip."""
    table_friction_scale: tuple[float, float] = (1.0, 1.0)
    """Manipulation tasks: range of factors (dimensionless) on the sliding friction of the
    table's top, one per world."""

    @field_validator(
        "mass_scale", "damping_scale", "friction_scale", "gain_scale", "contact_friction_scale",
        "light_intensity_scale", "object_mass", "object_size_scale", "object_friction_scale",
        "gripper_force_scale", "table_friction_scale",
    )
    @classmethod
    def _positive_range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        """A scale (or mass) range must be positive and ordered."""
        if value is None:
            return value
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

    @field_validator("object_yaw")
    @classmethod
    def _ordered_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        """An angle range must be ordered."""
        if value[0] > value[1]:
            raise PydanticCustomError("range", "a range (low, high) needs low <= high")
        return value

    def objects(self) -> tuple[str, ...]:
        """The manipulation fields (object, gripper, table) this scene sets."""
        return tuple(name for name, unset in OBJECT_DEFAULTS.items()
                     if getattr(self, name) != unset)

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
                {"named": ", ".join(named) or "none", "help": SUCCESS_HELP})
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
    seed_at_make: bool = False
    """Gymnasium tasks: make each world's environment with its own ``seed`` make kwarg (the
    number its first reset is seeded with), for an environment that draws its variation when
    it is made and ignores the seed of its reset (MetaWorld's ``Meta-World/MT1`` draws its 50
    goal and object placements from the make seed); false: every world is made alike."""
    success: SuccessConfig | None = None
    """Gymnasium tasks (required there): the success predicate of an episode."""
    description: str = ""
    """Free text: what condition the scene models."""
    instruction: Instruction | None = None
    """The instruction a policy that takes text is given with every episode (a remote
    policy's ``prompt``, a dataset's task text): one text, or a list of them, one drawn
    uniformly per episode from the scene's seed (:func:`episode_instructions`), recorded in
    the episode's ``instruction`` column and ranked as a factor like any other draw."""
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
        hz = _control_hz(task)
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
             "camera_angle_jitter", "image_noise_std", "object_mass", "object_size_scale",
             "object_friction_scale", "object_yaw", "gripper_force_scale",
             "table_friction_scale")
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

        ``randomization`` fields apply to MuJoCo scenes only. The task is the loaded scene's,
        whose id its loading checked; within :func:`tasks_from` an episode bound is said in
        the task's seconds too.
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
