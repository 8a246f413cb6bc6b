"""reach-v0 on MuJoCo: move the end effector of a 7-DOF arm to a randomized target point.

Model: ``sim_scenes/reach/arm7.xml``: position-servoed joints, gravity compensated by the
robot's controller. The compensation always uses the nominal link masses, so randomized heavier
links sag until the servos (and the policy) push back. Physics runs at 500 Hz; one control step
holds the servo targets for 20 physics steps, so the policy runs at 25 Hz.

Action (7, normalized to [-1, 1]): change of each joint's servo target, 1.0 = 0.1 rad per
control step. Targets accumulate from the previous step's targets and stay inside the joint
ranges; an action of zero holds the arm where it was commanded.

Observation (23, float32): joint positions (7, rad), joint velocities (7, rad/s), end-effector
position (3, m), target position (3, m), target minus end effector (3, m); all in the world
frame, with the scene's Gaussian noise added.

Reward: minus the end-effector-to-target distance (m), every step. Success: that distance is
below 0.03 m at the current state. A scene's payload is added to the last link (``link7``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stages.sim.tasks import reach_arm

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene

ARM7_XML = Path(__file__).resolve().parents[3] / "sim_scenes" / "reach" / "arm7.xml"
"""The MJCF model of the arm, the target marker, the floor and the overview camera."""

TASK_NAME = "reach-v0"
"""Registered id of this task."""

NUM_JOINTS = 7
"""Actuated joints of the arm (count)."""

FRAME_SKIP = 20
"""Physics steps (count) per control step."""

CONTROL_HZ = 25.0
"""Control rate (Hz): 1 / (timestep 0.002 s * FRAME_SKIP)."""

ACTION_SCALE = 0.1
"""Servo-target change (rad) per control step for an action of 1.0."""

SUCCESS_DISTANCE = 0.03
"""Success tolerance (m) on the end-effector-to-target distance."""

SUCCESS_TOLERANCE = reach_arm.reach_success_tolerance(SUCCESS_DISTANCE)
"""The success predicate in words."""

TARGET_NAMES = reach_arm.TARGET_NAMES
"""What each axis of a scene's target box is: the target point, world frame."""

TARGET_UNITS = reach_arm.TARGET_UNITS
"""Unit of each axis of a scene's target box."""

WORKSPACE_LOW = (0.2, -0.5, 0.08)
"""Lower corner (m) of the box in which the expert reaches every point."""

WORKSPACE_HIGH = (0.65, 0.5, 0.65)
"""Upper corner (m) of the box in which the expert reaches every point."""

HOME_NOISE = 0.1
"""Half-width (rad) of the uniform noise added to every joint of the home pose at reset."""

EXPERT_GAIN = 0.2
"""Fraction (per control step) of the end-effector error the expert asks to close."""

EXPERT_DAMPING = 0.05
"""Damping (m) of the expert's damped-least-squares inverse kinematics."""

EXPERT_NULL_GAIN = 0.1
"""Fraction (per control step) of the distance to the home pose the expert closes in the
null space of the end-effector task."""

_JOINTS = tuple(f"joint{i}" for i in range(1, NUM_JOINTS + 1))

OBS_NAMES: tuple[str, ...] = reach_arm.reach_obs_names(_JOINTS)
"""Name of every observation entry, in order."""

OBS_UNITS: tuple[str, ...] = reach_arm.reach_obs_units(NUM_JOINTS)
"""Unit of every observation entry, in order."""

ACTION_NAMES: tuple[str, ...] = reach_arm.reach_action_names(_JOINTS)
"""Name of every action entry, in order."""

ACTION_UNITS: tuple[str, ...] = (f"{ACTION_SCALE} rad",) * NUM_JOINTS
"""What an action of 1.0 means for every action entry."""

ARM = reach_arm.ReachArm(
    joints=_JOINTS,
    end_effector_site="ee",
    target_body="target",
    home=None,
    action_scale=ACTION_SCALE,
    success_distance=SUCCESS_DISTANCE,
    home_noise=HOME_NOISE,
    expert_gain=EXPERT_GAIN,
    expert_damping=EXPERT_DAMPING,
    expert_null_gain=EXPERT_NULL_GAIN,
)
"""How reach-v0 drives arm7: its names, tolerances and expert gains."""


class ReachEnv(reach_arm.ReachArmEnv):
    """N worlds of reach-v0, stepped together in C (see :mod:`stages.sim.tasks.reach_arm`).

    Randomization (masses, payload, damping, friction, actuator gains, target, initial pose)
    is drawn per world at every :meth:`reset` from ``np.random.default_rng(seed)``, so the same
    scene, world count and seed give identical observations.
    """

    def __init__(
        self, scene: Scene, num_worlds: int, seed: int, *, num_threads: int | None = None
    ) -> None:
        """Load the model and build ``num_worlds`` worlds for ``scene``; call reset() next.

        ``num_threads`` C threads step the worlds (default: every CPU).
        """
        super().__init__(
            scene,
            num_worlds,
            seed,
            task_name=TASK_NAME,
            model_path=ARM7_XML,
            frame_skip=FRAME_SKIP,
            control_hz=CONTROL_HZ,
            payload_body="link7",
            arm=ARM,
            num_threads=num_threads,
        )
        model = self._model
        if model.nq != NUM_JOINTS or model.nv != NUM_JOINTS or model.nu != NUM_JOINTS:
            raise ValueError(f"{ARM7_XML}: expected {NUM_JOINTS} joints and actuators")
