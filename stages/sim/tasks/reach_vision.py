"""reach-vision-v0: reach-v0's arm and expert, the target known to the policy only through a
camera.

Model: ``sim_scenes/reach_vision/arm7_vision.xml``: the reach-v0 arm on a grey table, an opaque
red target marker (0.045 m radius, visual only) and the ``front`` camera in front of the arm,
looking down at the workspace.

Observation: the state vector without the target: joint positions (7, rad), joint velocities
(7, rad/s), end-effector position (3, m), world frame, with the scene's Gaussian noise added;
and ``front_image``, the front camera's 64 x 64 RGB frame (uint8, HWC), rendered every control
step. Action, reward, success (0.03 m) and physics are reach-v0's. The scripted expert still
knows the target (it labels demonstrations and DAgger rounds; a policy never sees it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stages.sim.env.cameras import CameraSpec
from stages.sim.tasks import reach, reach_arm

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene

ARM7_VISION_XML = (Path(__file__).resolve().parents[3] / "sim_scenes" / "reach_vision"
                   / "arm7_vision.xml")
"""The MJCF model: reach-v0's arm, a table, a red target, a fill light and the front camera."""

TASK_NAME = "reach-vision-v0"
"""Registered id of this task."""

CAMERAS = (CameraSpec("front", "front", 64, 64),)
"""The camera the policy sees the target through: 64 x 64 RGB from the model's ``front``."""

CONTROL_HZ = reach.CONTROL_HZ
"""Control rate (Hz), reach-v0's."""

SUCCESS_TOLERANCE = reach.SUCCESS_TOLERANCE
"""The success predicate in words, reach-v0's."""

TARGET_NAMES = reach.TARGET_NAMES
"""What each axis of a scene's target box is: the target point, world frame."""

TARGET_UNITS = reach.TARGET_UNITS
"""Unit of each axis of a scene's target box."""

WORKSPACE_LOW = reach.WORKSPACE_LOW
"""Lower corner (m) of the box in which the expert reaches every point."""

WORKSPACE_HIGH = reach.WORKSPACE_HIGH
"""Upper corner (m) of the box in which the expert reaches every point."""

_STATE = 2 * reach.NUM_JOINTS + 3
"""Entries of reach-v0's observation that stay: joints and end effector."""

OBS_NAMES: tuple[str, ...] = reach.OBS_NAMES[:_STATE]
"""Name of every state entry, in order."""

OBS_UNITS: tuple[str, ...] = reach.OBS_UNITS[:_STATE]
"""Unit of every state entry, in order."""

ACTION_NAMES = reach.ACTION_NAMES
"""Name of every action entry, in order."""

ACTION_UNITS = reach.ACTION_UNITS
"""What an action of 1.0 means for every action entry."""


class ReachVisionEnv(reach_arm.ReachArmEnv):
    """N worlds of reach-vision-v0: reach-v0 whose target is seen, not read (module doc)."""

    def __init__(
        self, scene: Scene, num_worlds: int, seed: int, *, num_threads: int | None = None
    ) -> None:
        """Load the model and build ``num_worlds`` worlds for ``scene``; call reset() next."""
        super().__init__(
            scene, num_worlds, seed, task_name=TASK_NAME, model_path=ARM7_VISION_XML,
            frame_skip=reach.FRAME_SKIP, control_hz=CONTROL_HZ, payload_body="link7",
            arm=reach.ARM, num_threads=num_threads, cameras=CAMERAS)

    @property
    def obs_dim(self) -> int:
        """Length of one state vector: joints and end effector (17)."""
        return _STATE

    def _clean_observation(self) -> np.ndarray:
        """reach-v0's observation without the target entries. Shape: (N, 17)."""
        return super()._clean_observation()[:, :_STATE]
