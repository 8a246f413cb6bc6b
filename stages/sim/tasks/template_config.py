"""The task file of the reach template (``template: reach``): what it says, checked as it is read.

:class:`ReachTemplateConfig` is the file: the MJCF model, the controlled joints, the end
effector, the workspace, the control rate, the servos and the scripted expert's gains. The
names the template adds to the model are here too, since a model may not use them. Reading the
model and editing it into a reach arm is :mod:`stages.sim.tasks.template_model`'s; checking and
registering a task file, :mod:`stages.sim.tasks.template`'s.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    ConfigDict,
    Field,
    PositiveFloat,
    ValidationInfo,
    field_validator,
    model_validator,
)

from stages.core.schema import DocumentedModel
from stages.sim.tasks.catalog import Vec3

TARGET_BODY = "physai_target"
"""Name of the mocap body the template adds to mark the target."""

EE_SITE = "physai_end_effector"
"""Name of the site the template adds on the end-effector body when the task file names a
body."""

AXES = ("x", "y", "z")
"""The world axes a workspace's coordinates can be on, in their default order."""


class _TemplateModel(DocumentedModel):
    """Base of the task-file models: documented attributes, no NaN or infinity."""

    model_config = ConfigDict(allow_inf_nan=False)


class EndEffectorConfig(_TemplateModel):
    """The point of the arm that reaches: a site of the model, or a point on one of its bodies.

    Exactly one of ``site`` and ``body`` is given.
    """

    site: str | None = None
    """Name of a model site whose position is the end effector."""
    body: str | None = None
    """Name of a model body; the end effector is ``offset`` in that body's frame."""
    offset: Vec3 = (0.0, 0.0, 0.0)
    """Position (m, body frame) of the end effector on ``body``; only with ``body``."""

    @model_validator(mode="after")
    def _site_or_body(self) -> EndEffectorConfig:
        if (self.site is None) == (self.body is None):
            raise ValueError("give exactly one of site and body")
        if self.site is not None and self.offset != (0.0, 0.0, 0.0):
            raise ValueError("offset applies to a body, not to a site")
        return self


class WorkspaceConfig(_TemplateModel):
    """The box (m, world frame) of targets the scripted expert reaches; every scene's target
    box must lie inside it. One, two or three coordinates: a planar arm's is 2-D."""

    low: tuple[float, ...] = Field(min_length=1, max_length=3)
    """Lower corner (m, world frame), one coordinate per axis of ``axes``."""
    high: tuple[float, ...] = Field(min_length=1, max_length=3)
    """Upper corner (m, world frame), one coordinate per axis of ``axes``."""
    axes: tuple[Literal["x", "y", "z"], ...] | None = None
    """The world axes of the corners' coordinates, in order; None: x, y and z, as many as
    ``low`` has (``[x, y]`` for two)."""

    @model_validator(mode="after")
    def _ordered(self) -> WorkspaceConfig:
        if len(self.low) != len(self.high):
            raise ValueError(f"low has {len(self.low)} coordinates, high {len(self.high)}")
        if self.axes is not None and (len(self.axes) != len(self.low)
                                      or len(set(self.axes)) != len(self.axes)):
            raise ValueError(f"axes must name {len(self.low)} distinct axes, one per "
                             "coordinate of low and high")
        if any(lo > hi for lo, hi in zip(self.low, self.high, strict=True)):
            raise ValueError("low exceeds high")
        return self

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The world axes of the coordinates, in order (``axes`` or its default)."""
        return self.axes if self.axes is not None else AXES[: len(self.low)]

    @property
    def axis_indices(self) -> tuple[int, ...]:
        """The world axes of the coordinates as indices (0 x, 1 y, 2 z), in order."""
        return tuple(AXES.index(a) for a in self.axis_names)


class ServoConfig(_TemplateModel):
    """The position servo on every controlled joint: ``torque = kp (target - q) - kv qdot``.

    Each gain is one number for every joint or one number per joint, in ``joints`` order.
    """

    kp: PositiveFloat | tuple[PositiveFloat, ...] = 100.0
    """Stiffness (N m/rad)."""
    kv: PositiveFloat | tuple[PositiveFloat, ...] = 10.0
    """Damping (N m s/rad)."""
    force_limit: PositiveFloat | tuple[PositiveFloat, ...] | None = None
    """Largest torque magnitude (N m) a servo applies; None: unlimited."""


class ExpertConfig(_TemplateModel):
    """Gains of the scripted damped-least-squares expert (see :mod:`stages.sim.tasks.reach_arm`).

    A gain left out is derived from the edited model at its home pose
    (:class:`~stages.sim.tasks.template_model.ExpertGains`),
    so an arm of any size and inertia gets an expert that reaches; a number given is used as
    it is.
    """

    gain: float | None = Field(None, gt=0, le=1)
    """Fraction (per control step) of the end-effector error the expert asks to close; None:
    0.2, or less where the servos cannot follow that (:data:`SERVO_FOLLOW`)."""
    damping: PositiveFloat | None = None
    """Damping (m) of the damped-least-squares inverse kinematics; None: a tenth of the arm's
    reach at the home pose, at most 0.05 m."""
    null_gain: float | None = Field(None, ge=0, le=1)
    """Fraction (per control step) of the distance to the home pose closed in the null space;
    None: 0.1 for an arm with more joints than the workspace has axes, else 0 (no null space
    to use: a pull toward home would only fight the reach)."""


class ReachTemplateConfig(_TemplateModel):
    """A task file of the reach template: any arm model, made a reach task from config alone."""

    template: Literal["reach"]
    """Which template the file instantiates."""
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*(-[a-z0-9_]+)*-v[0-9]+$")
    """Versioned task id, e.g. ``pusher-reach-v0``; a change to the file bumps the version."""
    model: str = Field(min_length=1)
    """The MJCF file: a path relative to this task file, or ``pkg:PACKAGE/PATH``."""
    end_effector: EndEffectorConfig
    """The point that reaches: ``{site: NAME}`` or ``{body: NAME, offset: [x, y, z]}``."""
    joints: tuple[str, ...] = Field(min_length=1)
    """Controlled hinge joints, in observation and action order; every other joint is welded."""
    joint_ranges: dict[str, tuple[float, float]] = Field(default_factory=dict)
    """Range (rad) of controlled joints, by name: the joint's limit and its servo's control
    range, replacing the model's. A joint with no range here or in the model turns freely."""
    workspace: WorkspaceConfig
    """The box (m, world frame) of targets the scripted expert reaches."""
    control_hz: PositiveFloat
    """Control rate (Hz); 1 / (control_hz * timestep) must be a whole number of physics steps."""
    timestep: PositiveFloat | None = None
    """Physics timestep (s); None: the model's."""
    integrator: Literal["Euler", "RK4", "implicit", "implicitfast"] = "implicitfast"
    """MuJoCo integrator; ``implicitfast`` integrates the servos' damping implicitly."""
    gravity: Vec3 | None = None
    """Gravity (m/s^2, world frame); None: the model's."""
    servo: ServoConfig = Field(default_factory=lambda: ServoConfig())
    """The position servos' gains and torque limits."""
    action_scale: PositiveFloat = 0.1
    """Servo-target change (rad) per control step for an action of 1.0."""
    success_distance: PositiveFloat
    """Success tolerance (m) on the end-effector-to-target distance."""
    home: tuple[float, ...] | None = None
    """Home pose (rad) per joint, in ``joints`` order; None: the model's keyframe ``home``
    if it has one, else the middle of every joint's range."""
    home_noise: float = Field(0.1, ge=0)
    """Half-width (rad) of the uniform noise added to every joint of the home pose at reset."""
    expert: ExpertConfig = Field(default_factory=lambda: ExpertConfig())
    """Gains of the scripted expert."""
    payload_body: str | None = None
    """Body that a scene's payload mass is added to; None: the end effector's body."""
    camera: str = "overview"
    """Model camera that rollout videos are rendered from; added, aimed at the workspace, when
    the model has no camera of that name."""

    @field_validator("joints")
    @classmethod
    def _distinct(cls, joints: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(joints)) != len(joints):
            raise ValueError("a joint is listed more than once")
        return joints

    @field_validator("joint_ranges")
    @classmethod
    def _ranges_of_controlled_joints(
        cls, ranges: dict[str, tuple[float, float]], info: ValidationInfo
    ) -> dict[str, tuple[float, float]]:
        joints = info.data.get("joints", ())
        for name, (low, high) in ranges.items():
            if name not in joints:
                raise ValueError(f"{name!r} is not in joints")
            if not low < high:
                raise ValueError(f"{name}: low {low:g} is not below high {high:g}")
        return ranges
