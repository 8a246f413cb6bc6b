"""A scripted trotting gait for a four-legged robot with three-joint legs.

A clock drives every leg through stance and swing; diagonal legs move together (trot). In
stance a foot slides backwards under its hip at the speed the commanded base velocity asks of
it (forward, lateral and yaw), so stiff leg servos carry the torso along; in swing it lifts and
returns forward. Three feedback terms act on the true state:

- velocity: the stance sweep speed gets ``velocity_gain`` times the velocity error (forward,
  lateral and yaw rate) on top of the command;
- foot placement (Raibert): each touchdown point moves by ``placement_gain`` times the
  velocity error in the direction of the excess motion, which catches a shoved torso;
- pitch and roll: touchdown points move ``plumb_gain`` of the way from the torso's own down
  axis to the plumb line under each hip, so a tilted torso steps towards its low side.

Analytic inverse kinematics turns every foot target into joint angles.

Leg geometry, in the torso frame (x forward, y left, z up): each hip is a hinge about x
(abduction) at the hip point, then a hinge about y (hip pitch), a thigh, a hinge about y (knee)
and a shank ending at the foot centre. At zero angles the leg hangs straight down; a positive
hip angle swings the thigh backwards, and the knee bends with negative angles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TrotGait:
    """Parameters of the trot; every length in metres, every time in seconds."""

    period: float
    """Duration (s) of one gait cycle: a stance and a swing of every leg."""
    duty: float
    """Fraction (0..1) of the cycle a foot spends on the ground."""
    stance_height: float
    """Distance (m) from hip to foot centre, straight down, in stance."""
    lift: float
    """Height (m) a foot rises at mid-swing."""
    thigh: float
    """Hip-to-knee length (m)."""
    shank: float
    """Knee-to-foot-centre length (m)."""
    velocity_gain: float
    """Extra commanded speed (m/s) per m/s of velocity error, added to the stride."""
    placement_gain: float
    """Shift (m) of the touchdown point per m/s of velocity error, towards the motion."""
    plumb_gain: float
    """Fraction (0..1) by which touchdown points follow the plumb line under each hip when the
    torso is tilted, instead of the torso's own down axis."""
    max_stride: float
    """Largest foot travel (m) in one stance, per axis."""


def leg_phases(time: float, period: float, offsets: np.ndarray) -> np.ndarray:
    """Phase in [0, 1) of each leg at ``time`` (s).

    Args:
        time: Time since the gait started (s).
        period: Gait cycle (s).
        offsets: Phase offset of each leg. Shape: (L,).

    Returns:
        Phases. Shape: (L,).
    """
    return np.mod(time / period + offsets, 1.0)


def foot_targets(
    gait: TrotGait, phases: np.ndarray, stride: np.ndarray, placement: np.ndarray
) -> np.ndarray:
    """Foot-centre targets relative to each hip, in the torso frame.

    In stance a foot moves from ``stride / 2 + placement`` to ``-stride / 2``; in swing it
    rises by ``lift`` at mid-swing and returns, velocity zero at both ends, to the next
    touchdown point ``stride / 2 + placement``.

    Args:
        gait: Gait parameters.
        phases: Phase of each leg in [0, 1). Shape: (L,).
        stride: Foot travel (m) of each leg over one stance, x and y. Shape: (N, L, 2).
        placement: Shift (m) of each touchdown point, x and y. Shape: (N, L, 2).

    Returns:
        Foot targets (m) relative to the hips. Shape: (N, L, 3).
    """
    stance = phases < gait.duty
    s_stance = (phases / gait.duty)[None, :, None]
    s_swing = (phases - gait.duty) / (1.0 - gait.duty)
    blend = (0.5 * (1.0 - np.cos(np.pi * s_swing)))[None, :, None]
    in_stance = stride * (0.5 - s_stance) + placement * (1.0 - s_stance)
    in_swing = -0.5 * stride + (stride + placement) * blend
    feet = np.empty((*stride.shape[:2], 3))
    feet[:, :, :2] = np.where(stance[None, :, None], in_stance, in_swing)
    feet[:, :, 2] = -gait.stance_height + np.where(
        stance, 0.0, gait.lift * np.sin(np.pi * s_swing)
    )
    return feet


def leg_ik(feet: np.ndarray, thigh: float, shank: float) -> np.ndarray:
    """Joint angles (abduction, hip, knee) that put each foot centre at its target.

    Targets beyond reach are pulled in to the longest leg and knee angles kept strictly bent,
    so the result is always finite.

    Args:
        feet: Foot-centre targets relative to each hip, torso frame (m). Shape: (..., 3).
        thigh: Hip-to-knee length (m).
        shank: Knee-to-foot-centre length (m).

    Returns:
        Angles (rad). Shape: (..., 3).
    """
    x, y, z = feet[..., 0], feet[..., 1], feet[..., 2]
    abduction = np.arctan2(y, -z)
    down = np.hypot(y, z)
    reach = np.clip(np.hypot(x, down), 1e-6, 0.999 * (thigh + shank))
    cos_knee = (reach**2 - thigh**2 - shank**2) / (2.0 * thigh * shank)
    knee = -np.arccos(np.clip(cos_knee, -1.0, 1.0))
    swing = np.arctan2(-x, down)
    hip = swing - np.arctan2(shank * np.sin(knee), thigh + shank * np.cos(knee))
    return np.stack([abduction, hip, knee], axis=-1)


def trot_joint_targets(
    gait: TrotGait,
    time: float,
    offsets: np.ndarray,
    hips: np.ndarray,
    command: np.ndarray,
    velocity: np.ndarray,
    gravity: np.ndarray,
    angular_velocity: np.ndarray,
) -> np.ndarray:
    """Joint targets of the trot for every world.

    Args:
        gait: Gait parameters.
        time: Time since the episode started (s).
        offsets: Phase offset of each leg. Shape: (L,).
        hips: Hip positions in the torso frame (m). Shape: (L, 3).
        command: Commanded forward and lateral speed (m/s) and yaw rate (rad/s), torso
            frame. Shape: (N, 3).
        velocity: Measured linear velocity of the torso (m/s), torso frame. Shape: (N, 3).
        gravity: Unit gravity direction in the torso frame. Shape: (N, 3).
        angular_velocity: Measured angular velocity of the torso (rad/s), torso frame; its
            z component is the yaw rate. Shape: (N, 3).

    Returns:
        Joint angles (rad), legs in order, (abduction, hip, knee) per leg. Shape: (N, 3 L).
    """
    phases = leg_phases(time, gait.period, offsets)
    error = command - np.concatenate([velocity[:, :2], angular_velocity[:, 2:3]], axis=1)
    sweep = command + gait.velocity_gain * error
    foot_velocity = np.stack(
        [
            sweep[:, None, 0] - sweep[:, None, 2] * hips[None, :, 1],
            sweep[:, None, 1] + sweep[:, None, 2] * hips[None, :, 0],
        ],
        axis=-1,
    )
    stride = np.clip(foot_velocity * gait.period * gait.duty, -gait.max_stride, gait.max_stride)
    plumb = gait.stance_height * gravity[:, :2] / np.maximum(-gravity[:, 2:3], 0.5)
    placement = gait.plumb_gain * plumb - gait.placement_gain * error[:, :2]
    feet = foot_targets(gait, phases, stride, np.broadcast_to(placement[:, None, :], stride.shape))
    angles = leg_ik(feet, gait.thigh, gait.shank)
    return angles.reshape(len(command), -1)
