"""What every reach task shares: a position-servoed arm moving its end effector to a target.

:class:`ReachArmEnv` is the environment of such a task on MuJoCo, given the names of the
model's controlled joints, end-effector site and target marker, and a :class:`ReachArm` of
tolerances and gains. reach-v0 (:mod:`stages.sim.tasks.reach`) and the arms made from a task file
(:mod:`stages.sim.tasks.template`) are both one.

Action (one per joint, normalized to [-1, 1]): change of the joint's servo target, 1.0 =
``action_scale`` rad per control step. Targets accumulate from the previous step's targets and
stay inside the servo control ranges; an action of zero holds the arm where it was commanded.

Observation (float64 before noise): joint positions (rad), joint velocities (rad/s),
end-effector position (m), target position (m), target minus end effector (m); world frame.
The target has one, two or three coordinates (``ReachArm.target_axes``: x, y, z of the world
frame, all three for a 3-D workspace, x and y for a planar arm's); distances, the target and
its difference from the end effector are over those axes only.

Reward: minus the end-effector-to-target distance (m), every step. Success: that distance is
below ``success_distance`` at the current state. The scripted expert is damped-least-squares
inverse kinematics (:func:`dls_joint_step`).

A joint without a limit (a continuous hinge) and a servo without a control range are free:
poses and servo targets are clipped only where the model bounds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from stages.sim.env.batched import RobotEpisodes
from stages.sim.env.mujoco_env import MujocoBatchedEnv

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from stages.sim.env.cameras import CameraSpec
    from stages.sim.scenes.scene import Scene

TARGET_NAMES = ("x", "y", "z")
"""What each axis of a reach scene's target box is: the target point, world frame; a target
over fewer axes names those of them it has, in this order."""

TARGET_UNITS = ("m", "m", "m")
"""Unit of each axis of a reach scene's target box."""


def reach_obs_names(
    joints: Sequence[str], axes: Sequence[str] = TARGET_NAMES
) -> tuple[str, ...]:
    """Name of every observation entry of a reach task over ``joints`` whose target has the
    coordinates ``axes`` (names of :data:`TARGET_NAMES`), in order."""
    return (
        *(f"{j}.pos" for j in joints),
        *(f"{j}.vel" for j in joints),
        "ee.x",
        "ee.y",
        "ee.z",
        *(f"target.{a}" for a in axes),
        *(f"target_minus_ee.{a}" for a in axes),
    )


def reach_obs_units(num_joints: int, num_axes: int = 3) -> tuple[str, ...]:
    """Unit of every observation entry of a reach task over ``num_joints`` joints whose target
    has ``num_axes`` coordinates, in order."""
    return ("rad",) * num_joints + ("rad/s",) * num_joints + ("m",) * (3 + 2 * num_axes)


def reach_action_names(joints: Sequence[str]) -> tuple[str, ...]:
    """Name of every action entry of a reach task over ``joints``, in order."""
    return tuple(f"{j}.target_delta" for j in joints)


def reach_success_tolerance(success_distance: float) -> str:
    """The success predicate of a reach task, in words."""
    return (f"end effector within {success_distance:g} m (Euclidean) of the target at the "
            "current state")


def dls_joint_step(
    jac: np.ndarray,
    error: np.ndarray,
    home_pull: np.ndarray,
    damping: float,
) -> np.ndarray:
    """Damped-least-squares joint step toward a point, with a secondary pull in the null space.

    Returns ``dq = J^T (J J^T + d^2 I)^-1 e + (I - J# J) p`` with ``J# = J^T (J J^T + d^2 I)^-1``.

    Args:
        jac: End-effector position Jacobians (m/rad) over the k target axes. Shape: (N, k, n).
        error: The end-effector displacement asked for (m). Shape: (N, k).
        home_pull: The joint displacement asked for in the null space (rad). Shape: (N, n).
        damping: Damping ``d`` (m).

    Returns:
        Joint displacements (rad). Shape: (N, n).
    """
    jac_t = jac.transpose(0, 2, 1)
    gram = jac @ jac_t + damping**2 * np.eye(jac.shape[1])
    pinv = jac_t @ np.linalg.inv(gram)
    dq = (pinv @ error[:, :, None])[:, :, 0]
    null = np.eye(jac.shape[2]) - pinv @ jac
    dq += (null @ home_pull[:, :, None])[:, :, 0]
    return dq


@dataclass(frozen=True)
class ReachArm:
    """How a reach task drives its arm: model names, tolerances and the expert's gains."""

    joints: tuple[str, ...]
    """Controlled joints (hinges), in observation and action order; position servo ``i`` of
    the model drives joint ``i``."""
    end_effector_site: str
    """Model site whose position is the end effector."""
    target_body: str
    """Mocap body of the model that marks the target."""
    home: tuple[float, ...] | None
    """Home pose (rad) per joint; None: the model's keyframe ``home``."""
    action_scale: float
    """Servo-target change (rad) per control step for an action of 1.0."""
    success_distance: float
    """Success tolerance (m) on the end-effector-to-target distance."""
    home_noise: float
    """Half-width (rad) of the uniform noise added to every joint of the home pose at reset."""
    expert_gain: float
    """Fraction (per control step) of the end-effector error the expert asks to close."""
    expert_damping: float
    """Damping (m) of the expert's damped-least-squares inverse kinematics."""
    expert_null_gain: float
    """Fraction (per control step) of the distance to the home pose the expert closes in the
    null space of the end-effector task."""
    target_axes: tuple[int, ...] = (0, 1, 2)
    """World axes (0 x, 1 y, 2 z) the target has coordinates on, in order; distances are
    measured over these. On the others the target marker stays where the model puts it."""


@dataclass(frozen=True)
class ArmState:
    """What a reach task reads of the simulator, per world (SI units, world frame)."""

    joint_pos: np.ndarray
    """Controlled joint positions (rad), the arm's joint order. Shape: (N, n)."""
    joint_vel: np.ndarray
    """Controlled joint velocities (rad/s). Shape: (N, n)."""
    ee_pos: np.ndarray
    """End-effector position (m) in the world's own frame. Shape: (N, 3)."""


class ReachTask(RobotEpisodes):
    """A reach task on any backend: target and pose draws, action semantics, observation,
    reward, success and the damped-least-squares expert, as functions of an
    :class:`ArmState`.

    A backend's environment derives from this and from its own episode backend, calls
    :meth:`_start_reach` and defines :meth:`_place_arm`, :meth:`_send_servo_targets`,
    :meth:`_read_arm` and :meth:`_ee_jacobian`.
    """

    _state: ArmState

    def _start_reach(self, arm: ReachArm, home: np.ndarray,
                     joint_bounds: tuple[np.ndarray, np.ndarray],
                     ctrl_bounds: tuple[np.ndarray, np.ndarray]) -> None:
        """Set the arm's names and gains, its home pose (rad) and its joint and servo-target
        bounds (rad; infinite where the model sets none)."""
        self._arm = arm
        self._num_joints = len(arm.joints)
        self._home = np.asarray(home, dtype=np.float64)
        self._joint_low, self._joint_high = joint_bounds
        self._ctrl_low, self._ctrl_high = ctrl_bounds
        self._axes = np.array(arm.target_axes)
        self._target = np.zeros((self._num_worlds, len(arm.target_axes)))
        self._servo = np.zeros((self._num_worlds, self._num_joints))

    @property
    def obs_dim(self) -> int:
        """Length of one observation vector: 2 per joint, 3, and 2 per target axis."""
        return 2 * self._num_joints + 3 + 2 * len(self._axes)

    @property
    def act_dim(self) -> int:
        """Length of one action vector: one per joint."""
        return self._num_joints

    def success(self) -> np.ndarray:
        """Whether each end effector is within success_distance of its target.

        Returns:
            Shape: (num_worlds,), bool.
        """
        self._require_episode()
        return self._distance() < self._arm.success_distance

    def expert_action(self) -> np.ndarray:
        """Damped-least-squares inverse kinematics toward the true target.

        The expert asks for ``dq = J^T (J J^T + d^2 I)^-1 (g e) + (I - J# J) (h (q_home - q))``
        (:func:`dls_joint_step`) with ``e`` the true end-effector error (m) over the target
        axes, ``J`` the end-effector position Jacobian over the controlled joints and the
        target axes (k x n), ``g`` = expert_gain,
        ``d`` = expert_damping, ``h`` = expert_null_gain, then divides by action_scale and
        shrinks the whole vector until it lies in [-1, 1].

        Returns:
            Actions in [-1, 1]. Shape: (num_worlds, act_dim), float32.
        """
        self._require_episode()
        arm, state = self._arm, self._state
        dq = dls_joint_step(
            self._ee_jacobian()[:, self._axes],
            arm.expert_gain * (self._target - state.ee_pos[:, self._axes]),
            arm.expert_null_gain * (self._home - state.joint_pos),
            arm.expert_damping,
        )
        action = dq / arm.action_scale
        action /= np.maximum(1.0, np.abs(action).max(axis=1, keepdims=True))
        return action.astype(np.float32)

    def episode_miss(self) -> tuple[np.ndarray, str]:
        """The end effector's distance to its target (m). Shape: (num_worlds,)."""
        self._require_episode()
        return self._distance(), "m"

    def _episode_target(self) -> tuple[np.ndarray, tuple[str, ...], tuple[str, ...]]:
        """The target point drawn for each world (m), over the target axes."""
        axes = self._arm.target_axes
        return (self._target, tuple(TARGET_NAMES[a] for a in axes),
                tuple(TARGET_UNITS[a] for a in axes))

    def _reset_worlds(self) -> None:
        """Draw targets and initial poses near home; servo targets start at the pose."""
        n, rand, rng = self._num_worlds, self._rand, self._rng
        self._target = rng.uniform(rand.target_low, rand.target_high, size=(n, len(self._axes)))
        noise = rng.uniform(-self._arm.home_noise, self._arm.home_noise,
                            size=(n, self._num_joints))
        qpos0 = np.clip(self._home + noise, self._joint_low, self._joint_high)
        self._servo = qpos0.copy()
        self._place_arm(qpos0)

    def _apply_action(self, chosen: np.ndarray, applied: np.ndarray) -> None:
        """Move every servo target by action_scale * action, inside the control range."""
        self._servo = np.clip(self._servo + self._arm.action_scale * applied, self._ctrl_low,
                              self._ctrl_high)
        self._send_servo_targets(self._servo)

    def _sense(self) -> None:
        """Read the arm's state from the backend."""
        self._state = self._read_arm()

    def _after_step(self) -> None:
        """Nothing to track beyond the state the backend holds."""

    def _reward(self) -> np.ndarray:
        """Minus the end-effector-to-target distance (m). Shape: (N,)."""
        return -self._distance()

    def _distance(self) -> np.ndarray:
        """End-effector-to-target distance (m) over the target axes. Shape: (N,)."""
        return np.linalg.norm(self._target - self._state.ee_pos[:, self._axes], axis=1)

    def _clean_observation(self) -> np.ndarray:
        """Joint state, end effector, target and their difference over the target axes.
        Shape: (N, 2 n + 3 + 2 k)."""
        state = self._state
        ee = state.ee_pos
        return np.concatenate(
            [state.joint_pos, state.joint_vel, ee, self._target, self._target - ee[:, self._axes]],
            axis=1,
        )

    def _place_arm(self, qpos: np.ndarray) -> None:
        """Backend: put every world's arm at ``qpos`` (rad; shape (N, n)), still, its servos
        holding that pose, and the target marker at ``self._target``."""
        raise NotImplementedError

    def _send_servo_targets(self, targets: np.ndarray) -> None:
        """Backend: set every servo's target (rad). Shape: (N, n)."""
        raise NotImplementedError

    def _read_arm(self) -> ArmState:
        """Backend: the arm's state now."""
        raise NotImplementedError

    def _ee_jacobian(self) -> np.ndarray:
        """Backend: the end-effector position Jacobian (m/rad) over the world's three axes and
        the controlled joints, at the current state. Shape: (N, 3, n)."""
        raise NotImplementedError


class ArmModel(TypedDict):
    """How a reach task's MJCF is stepped on MuJoCo (:class:`MujocoBatchedEnv`'s arguments)."""

    task_name: str
    """The task id."""
    model_path: Path
    """The MJCF file."""
    frame_skip: int
    """Physics steps per control step."""
    control_hz: float
    """Control rate (Hz); must equal 1 / (timestep * frame_skip)."""
    payload_body: str
    """Body that the scene's payload mass is added to."""


class ReachArmEnv(ReachTask, MujocoBatchedEnv):
    """N worlds of a reach task on MuJoCo, stepped together in C (see
    :mod:`stages.sim.env.mujoco_env`).

    Randomization (masses, payload, damping, friction, actuator gains, target, initial pose)
    is drawn per world at every :meth:`reset` from ``np.random.default_rng(seed)``, so the same
    scene, world count and seed give identical observations.
    """

    def __init__(self, scene: Scene, num_worlds: int, seed: int, *, arm: ReachArm,
                 num_threads: int | None = None, cameras: Sequence[CameraSpec] = (),
                 **mjcf: Unpack[ArmModel]) -> None:
        """Load the model and build ``num_worlds`` worlds for ``scene``; call reset() next.

        Args:
            scene: A scene of task ``mjcf["task_name"]``.
            num_worlds: Worlds N stepped together (>= 1).
            seed: Seed of every random draw.
            arm: The model's names, the tolerances and the expert's gains.
            num_threads: C threads stepping the worlds; None: every CPU.
            cameras: The task's cameras, rendered from the model's cameras.
            **mjcf: The MJCF (the arm, its servos, the target marker and a camera) and how
                it is stepped (:class:`ArmModel`).
        """
        import mujoco

        MujocoBatchedEnv.__init__(self, scene, num_worlds, seed, **mjcf,
                                  step_stage=mujoco.mjtStage.mjSTAGE_POS,
                                  num_threads=num_threads, cameras=cameras)
        model_path = mjcf["model_path"]
        model = self._model
        joint_ids = [model.joint(j).id for j in arm.joints]
        hinges = all(model.jnt_type[j] == mujoco.mjtJoint.mjJNT_HINGE for j in joint_ids)
        driven = [int(model.actuator_trnid[a, 0]) for a in range(model.nu)]
        if not hinges or driven != joint_ids:
            raise ValueError(f"{model_path}: expected one position servo per joint of "
                             f"{', '.join(arm.joints)}, in that order")
        self._qpos_idx = model.jnt_qposadr[joint_ids].copy()
        self._dof_idx = model.jnt_dofadr[joint_ids].copy()
        self._ee = model.site(arm.end_effector_site).id
        self._ee_body = int(model.site_bodyid[self._ee])
        self._mocap = int(model.body_mocapid[model.body(arm.target_body).id])
        home = (model.key("home").qpos[self._qpos_idx].copy() if arm.home is None
                else np.array(arm.home, dtype=np.float64))
        self._start_reach(
            arm, home,
            _bounds(model.jnt_range[joint_ids], model.jnt_limited[joint_ids]),
            _bounds(model.actuator_ctrlrange, model.actuator_ctrllimited))
        self._site_xpos = self._batch.bind("site_xpos")
        self._mocap_pos = self._batch.bind("mocap_pos")
        self._sense()

    def _place_arm(self, qpos: np.ndarray) -> None:
        """Write the pose and servo targets into the batch and the target into the marker."""
        self._qpos[:, self._qpos_idx] = qpos
        self._ctrl[:] = qpos
        self._mocap_pos[:, self._mocap, self._axes] = self._target

    def _send_servo_targets(self, targets: np.ndarray) -> None:
        """Write the servo targets into the batch's controls."""
        self._ctrl[:] = targets

    def _read_arm(self) -> ArmState:
        """Joints and end effector from the batch."""
        return ArmState(joint_pos=np.array(self._qpos[:, self._qpos_idx]),
                        joint_vel=np.array(self._qvel[:, self._dof_idx]),
                        ee_pos=np.array(self._site_xpos[:, self._ee]))

    def _ee_jacobian(self) -> np.ndarray:
        """The batch's end-effector Jacobian over the controlled joints' dofs."""
        jac, _ = self._batch.jac(self._ee_body, self._state.ee_pos)
        return np.asarray(jac[:, :, self._dof_idx])


def _bounds(ranges: np.ndarray, limited: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of each row of ``ranges`` (shape (m, 2)), infinite where
    ``limited`` (shape (m,)) says the row bounds nothing."""
    bounded = np.asarray(limited, dtype=bool)
    return (np.where(bounded, ranges[:, 0], -np.inf), np.where(bounded, ranges[:, 1], np.inf))
