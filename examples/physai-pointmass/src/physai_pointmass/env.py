"""The batched environment of pointmass-v0, on physai-flows' MuJoCo base class.

Observation (8, float32): puck position (2, m), puck velocity (2, m/s), target position (2, m),
target minus puck (2, m), in the table frame, with the scene's Gaussian noise added.
Action (2, normalized to [-1, 1]): horizontal force on the puck, 1.0 = 4 N.
Reward: minus the puck-to-target distance (m), every step. Success: that distance is below
0.02 m. Scripted expert: a PD law on the true state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from stages.sim.mujoco_env import MujocoBatchedEnv

if TYPE_CHECKING:
    from stages.sim.scene import Scene

TASK_NAME = "pointmass-v0"
"""Registered id of this task."""

FRAME_SKIP = 5
"""Physics steps (count) per control step."""

CONTROL_HZ = 20.0
"""Control rate (Hz): 1 / (timestep 0.01 s * FRAME_SKIP)."""

FORCE_SCALE = 4.0
"""Force (N) on each axis for an action of 1.0."""

PUCK_HEIGHT = 0.02
"""Height (m) of the puck's centre above the table: the z of every target."""

SUCCESS_DISTANCE = 0.02
"""Success tolerance (m) on the puck-to-target distance."""

SUCCESS_TOLERANCE = "puck within 0.02 m (Euclidean, in the table plane) of the target"
"""The success predicate in words."""

EXPERT_KP = 40.0
"""Stiffness (N/m) of the expert's PD law."""

EXPERT_KD = 6.0
"""Damping (N s/m) of the expert's PD law, on top of the joints' own."""

START_HALF_WIDTH = 0.3
"""Half-width (m) of the square the puck starts in, uniformly."""

OBS_NAMES = ("puck.x", "puck.y", "puck.vx", "puck.vy", "target.x", "target.y",
             "target_minus_puck.x", "target_minus_puck.y")
"""Name of every observation entry, in order."""

OBS_UNITS = ("m", "m", "m/s", "m/s", "m", "m", "m", "m")
"""Unit of every observation entry, in order."""

ACTION_NAMES = ("force.x", "force.y")
"""Name of every action entry, in order."""

ACTION_UNITS = (f"{FORCE_SCALE} N", f"{FORCE_SCALE} N")
"""What an action of 1.0 means for every action entry."""


class PointMassEnv(MujocoBatchedEnv):
    """N worlds of pointmass-v0 stepped together (randomization drawn at every reset)."""

    def __init__(
        self, scene: Scene, num_worlds: int, seed: int, *, num_threads: int | None = None
    ) -> None:
        """Load the model and build ``num_worlds`` worlds of ``scene``; call reset() next."""
        from physai_pointmass import MODEL_XML

        super().__init__(
            scene, num_worlds, seed, task_name=TASK_NAME, model_path=MODEL_XML,
            frame_skip=FRAME_SKIP, control_hz=CONTROL_HZ, payload_body="puck",
            num_threads=num_threads,
        )
        self._mocap = int(self._model.body_mocapid[self._model.body("target").id])
        self._mocap_pos = self._batch.bind("mocap_pos")
        self._target = np.zeros((num_worlds, 2))

    @property
    def obs_dim(self) -> int:
        """Length of one observation vector (8)."""
        return len(OBS_NAMES)

    @property
    def act_dim(self) -> int:
        """Length of one action vector (2)."""
        return len(ACTION_NAMES)

    def success(self) -> np.ndarray:
        """Whether each puck is within 0.02 m of its target. Shape: (num_worlds,), bool."""
        self._require_episode()
        return self._distance() < SUCCESS_DISTANCE

    def expert_action(self) -> np.ndarray:
        """PD force toward the true target, normalized. Shape: (num_worlds, 2), float32."""
        self._require_episode()
        force = EXPERT_KP * (self._target - self._qpos) - EXPERT_KD * self._qvel
        return np.clip(force / FORCE_SCALE, -1.0, 1.0).astype(np.float32)

    def _reset_worlds(self) -> None:
        """Draw targets and start positions; the puck starts at rest."""
        n, rand, rng = self._num_worlds, self._rand, self._rng
        self._target = rng.uniform(rand.target_low[:2], rand.target_high[:2], size=(n, 2))
        self._qpos[:] = rng.uniform(-START_HALF_WIDTH, START_HALF_WIDTH, size=(n, 2))
        self._ctrl[:] = 0.0
        self._mocap_pos[:, self._mocap, :2] = self._target
        self._mocap_pos[:, self._mocap, 2] = PUCK_HEIGHT

    def _apply_action(self, chosen: np.ndarray, applied: np.ndarray) -> None:
        """Push with FORCE_SCALE * action on each axis."""
        self._ctrl[:] = FORCE_SCALE * applied

    def _after_step(self) -> None:
        """Nothing to track beyond the state the batch holds."""

    def _reward(self) -> np.ndarray:
        """Minus the puck-to-target distance (m). Shape: (N,)."""
        return -self._distance()

    def episode_miss(self) -> tuple[np.ndarray, str]:
        """How far each puck is from its target at the episode's end (m): with it, validation
        records every episode's conditions and miss. Shape: (num_worlds,), float64."""
        self._require_episode()
        return self._distance().astype(np.float64), "m"

    def _episode_target(self) -> tuple[np.ndarray, tuple[str, ...], tuple[str, ...]]:
        """The target drawn for each world (m), so that validation's episode records and its
        ranking of what failures go with carry it as ``target_x`` and ``target_y``."""
        return self._target.copy(), ("x", "y"), ("m", "m")

    def _distance(self) -> np.ndarray:
        """Puck-to-target distance (m). Shape: (N,)."""
        return np.linalg.norm(self._target - self._qpos, axis=1)

    def _clean_observation(self) -> np.ndarray:
        """Puck state, target and their difference. Shape: (N, 8)."""
        pos = np.array(self._qpos)
        return np.concatenate([pos, self._qvel, self._target, self._target - pos], axis=1)
