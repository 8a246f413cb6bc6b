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

import mujoco
import numpy as np

from stages.sim.mujoco_env import MujocoBatchedEnv

if TYPE_CHECKING:
    from stages.sim.scene import Scene

ARM7_XML = Path(__file__).resolve().parents[2] / "sim_scenes" / "reach" / "arm7.xml"
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

SUCCESS_TOLERANCE = "end effector within 0.03 m (Euclidean) of the target at the current state"
"""The success predicate in words."""

TARGET_NAMES = ("x", "y", "z")
"""What each axis of a scene's target box is: the target point, world frame."""

TARGET_UNITS = ("m", "m", "m")
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

OBS_NAMES: tuple[str, ...] = (
    *(f"{j}.pos" for j in _JOINTS),
    *(f"{j}.vel" for j in _JOINTS),
    "ee.x",
    "ee.y",
    "ee.z",
    "target.x",
    "target.y",
    "target.z",
    "target_minus_ee.x",
    "target_minus_ee.y",
    "target_minus_ee.z",
)
"""Name of every observation entry, in order."""

OBS_UNITS: tuple[str, ...] = ("rad",) * NUM_JOINTS + ("rad/s",) * NUM_JOINTS + ("m",) * 9
"""Unit of every observation entry, in order."""

ACTION_NAMES: tuple[str, ...] = tuple(f"{j}.target_delta" for j in _JOINTS)
"""Name of every action entry, in order."""

ACTION_UNITS: tuple[str, ...] = (f"{ACTION_SCALE} rad",) * NUM_JOINTS
"""What an action of 1.0 means for every action entry."""


class ReachEnv(MujocoBatchedEnv):
    """N worlds of reach-v0, stepped together in C (see :mod:`stages.sim.mujoco_env`).

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
            step_stage=mujoco.mjtStage.mjSTAGE_POS,
            num_threads=num_threads,
        )
        model = self._model
        if model.nq != NUM_JOINTS or model.nv != NUM_JOINTS or model.nu != NUM_JOINTS:
            raise ValueError(f"{ARM7_XML}: expected {NUM_JOINTS} joints and actuators")
        self._ee = model.site("ee").id
        self._ee_body = int(model.site_bodyid[self._ee])
        self._mocap = int(model.body_mocapid[model.body("target").id])
        self._home = model.key("home").qpos.copy()
        self._joint_low = model.jnt_range[:, 0].copy()
        self._joint_high = model.jnt_range[:, 1].copy()
        self._ctrl_low = model.actuator_ctrlrange[:, 0].copy()
        self._ctrl_high = model.actuator_ctrlrange[:, 1].copy()
        self._site_xpos = self._batch.bind("site_xpos")
        self._mocap_pos = self._batch.bind("mocap_pos")
        self._target = np.zeros((num_worlds, 3))

    @property
    def obs_dim(self) -> int:
        """Length of one observation vector (23)."""
        return len(OBS_NAMES)

    @property
    def act_dim(self) -> int:
        """Length of one action vector (7)."""
        return NUM_JOINTS

    def success(self) -> np.ndarray:
        """Whether each end effector is within 0.03 m of its target. Shape: (num_worlds,), bool."""
        self._require_episode()
        return self._distance() < SUCCESS_DISTANCE

    def expert_action(self) -> np.ndarray:
        """Damped-least-squares inverse kinematics toward the true target.

        The expert asks for ``dq = J^T (J J^T + d^2 I)^-1 (g e) + (I - J# J) (h (q_home - q))``
        with ``e`` the true end-effector error (m), ``J`` the end-effector position Jacobian
        (3 x 7), ``g`` = EXPERT_GAIN, ``d`` = EXPERT_DAMPING, ``h`` = EXPERT_NULL_GAIN, then
        divides by ACTION_SCALE and shrinks the whole vector until it lies in [-1, 1].

        Returns:
            Actions in [-1, 1]. Shape: (num_worlds, 7), float32.
        """
        self._require_episode()
        ee_pos = self._ee_pos()
        jac, _ = self._batch.jac(self._ee_body, ee_pos)
        jac_t = jac.transpose(0, 2, 1)
        gram = jac @ jac_t + EXPERT_DAMPING**2 * np.eye(3)
        pinv = jac_t @ np.linalg.inv(gram)
        error = EXPERT_GAIN * (self._target - ee_pos)
        dq = (pinv @ error[:, :, None])[:, :, 0]
        null = np.eye(NUM_JOINTS) - pinv @ jac
        pull = EXPERT_NULL_GAIN * (self._home - self._qpos)
        dq += (null @ pull[:, :, None])[:, :, 0]
        action = dq / ACTION_SCALE
        action /= np.maximum(1.0, np.abs(action).max(axis=1, keepdims=True))
        return action.astype(np.float32)

    def _reset_worlds(self) -> None:
        """Draw targets and initial poses near home; servo targets start at the pose."""
        n, rand, rng = self._num_worlds, self._rand, self._rng
        self._target = rng.uniform(rand.target_low, rand.target_high, size=(n, 3))
        noise = rng.uniform(-HOME_NOISE, HOME_NOISE, size=(n, NUM_JOINTS))
        qpos0 = np.clip(self._home + noise, self._joint_low, self._joint_high)
        self._qpos[:] = qpos0
        self._ctrl[:] = qpos0
        self._mocap_pos[:, self._mocap] = self._target

    def _apply_action(self, chosen: np.ndarray, applied: np.ndarray) -> None:
        """Move every servo target by ACTION_SCALE * action, inside the control range."""
        self._ctrl[:] = np.clip(
            self._ctrl + ACTION_SCALE * applied, self._ctrl_low, self._ctrl_high
        )

    def _after_step(self) -> None:
        """Nothing to track beyond the state the batch holds."""

    def _reward(self) -> np.ndarray:
        """Minus the end-effector-to-target distance (m). Shape: (N,)."""
        return -self._distance()

    def _ee_pos(self) -> np.ndarray:
        """End-effector position (m, world frame). Shape: (N, 3)."""
        return np.array(self._site_xpos[:, self._ee])

    def _distance(self) -> np.ndarray:
        """End-effector-to-target distance (m). Shape: (N,)."""
        return np.linalg.norm(self._target - self._ee_pos(), axis=1)

    def _clean_observation(self) -> np.ndarray:
        """Joint state, end effector, target and their difference. Shape: (N, 23)."""
        ee = self._ee_pos()
        return np.concatenate(
            [self._qpos, self._qvel, ee, self._target, self._target - ee], axis=1
        )
