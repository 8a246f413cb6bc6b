"""What the scripted grasp expert of the manipulation tasks (:mod:`stages.sim.tasks.manipulation`)
is tuned by, and the geometry it reads the object's pose with."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ExpertGains:
    """The scripted grasp expert's gains and tolerances (SI units)."""

    position_gain: float = 0.35
    """Fraction (per control step) of the grasp point's position error asked for."""
    rotation_gain: float = 0.35
    """Fraction (per control step) of the hand's orientation error asked for."""
    max_position_error: float = 0.04
    """Largest position error (m) asked for in one control step."""
    max_rotation_error: float = 0.5
    """Largest orientation error (rad) asked for in one control step."""
    damping: float = 0.05
    """Damping of the damped-least-squares inverse kinematics (m, rad)."""
    null_gain: float = 0.05
    """Fraction (per control step) of the distance to the home pose closed in the null space."""
    pregrasp_height: float = 0.10
    """Height (m) above the object's centre the grasp point approaches first."""
    grasp_offset: float = 0.005
    """Height (m) of the grasp point above the object's centre when it closes."""
    lift_height: float = 0.17
    """Height (m) above the table lift-v0's grasp point rises to."""
    carry_height: float = 0.20
    """Height (m) above the table pick-place-v0 carries at."""
    carry_clear: float = 0.12
    """Height (m) of the object above the table before it is carried sideways."""
    xy_tolerance: float = 0.01
    """Distance (m, horizontal) from above the object within which the hand descends."""
    yaw_tolerance: float = 0.1
    """Largest error (rad) of the fingers' alignment with a face of the object to descend."""


def wrap_angle(angle: np.ndarray) -> np.ndarray:
    """Angles (rad) wrapped into [-pi, pi)."""
    return (angle + np.pi) % (2 * np.pi) - np.pi


def clipped_rows(error: np.ndarray, limit: float) -> np.ndarray:
    """Each row of ``error`` shrunk to length ``limit`` where it is longer. Shape: (N, k)."""
    norm = np.linalg.norm(error, axis=1, keepdims=True)
    return error * np.minimum(1.0, limit / np.maximum(norm, 1e-12))


def face_yaw(quat: np.ndarray) -> np.ndarray:
    """The yaw (rad, within +-pi/4) of the face of each cube (orientations w, x, y, z; shape
    (N, 4)) whose normal is nearest the world's y axis, as a turn of the hand from home."""
    w, x, y, z = quat.T
    x_axis = np.column_stack([1 - 2 * (y * y + z * z), 2 * (x * y + w * z)])
    yaw = np.arctan2(x_axis[:, 1], x_axis[:, 0])
    return (yaw + np.pi / 4) % (np.pi / 2) - np.pi / 4
