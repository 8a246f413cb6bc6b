"""Small camera scenes and episodes for the LeRobot dataset tests, on both sides: in the project's
venv and in the lerobot stage environment (numpy only, nothing of the project imported).

The frames look like the reach-vision task's renders: a lit grey table in a gradient and a red
target that moves a pixel or two a frame. The codec tolerance the round trips are held to is
stated here once (docs/datasets.md quotes it): LeRobot's AV1 (SVT-AV1, crf 30, yuv420p) gives
back every frame within a mean absolute difference of :data:`FRAME_MAE` levels of 255, and the
whole dataset within :data:`MEAN_MAE`; single pixels on the target's edge differ by more
(yuv420p shares one colour among 2x2 pixels).
"""

from __future__ import annotations

import numpy as np

FRAME_MAE = 8.0
"""The most any one frame's mean absolute difference (0..255 levels) may be after encoding."""
MEAN_MAE = 4.0
"""The most the mean absolute difference over all frames may be."""
TASK = "reach-vision-v0"
OBS_DIM, ACT_DIM = 17, 7
SIZE = 64
"""reach-vision-v0's front camera: 64x64."""
EPISODES, STEPS = 2, 20


def scene(steps: int, seed: int, size: int = SIZE) -> np.ndarray:
    """``steps`` frames (steps, size, size, 3) uint8 of a red target moving over a table."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    table = np.stack([90 + 0.8 * xx, 85 + 0.6 * yy, 110 + 0.3 * (xx + yy)], -1)
    start = rng.uniform(0.3, 0.6, 2) * size
    step = rng.uniform(-1.5, 1.5, 2)
    frames = np.empty((steps, size, size, 3), np.uint8)
    for t in range(steps):
        cx, cy = start + t * step
        image = table.copy()
        image[(xx - cx) ** 2 + (yy - cy) ** 2 < (size / 10) ** 2] = (210, 40, 35)
        frames[t] = image.clip(0, 255).astype(np.uint8)
    return frames


def episodes(n: int = EPISODES, steps: int = STEPS, seed: int = 0,
             size: int = SIZE) -> dict[str, np.ndarray]:
    """``n`` episodes as arrays named ``obs<i>`` (steps, OBS_DIM), ``actions<i>`` (steps,
    ACT_DIM) float32 and ``front<i>`` (steps, size, size, 3) uint8: what an npz file holds."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for i in range(n):
        out[f"obs{i}"] = rng.normal(size=(steps, OBS_DIM)).astype(np.float32)
        out[f"actions{i}"] = rng.uniform(-1, 1, (steps, ACT_DIM)).astype(np.float32)
        out[f"front{i}"] = scene(steps, seed * 100 + i, size)
    return out


def frame_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Each frame's mean absolute difference, (T,) in levels of 255."""
    assert got.shape == want.shape, (got.shape, want.shape)
    return np.abs(got.astype(np.int16) - want.astype(np.int16)).mean(axis=(1, 2, 3))


def assert_within_tolerance(got: np.ndarray, want: np.ndarray) -> float:
    """Frames ``got`` are ``want`` within the codec tolerance; returns the mean difference."""
    errors = frame_errors(got, want)
    assert errors.max() <= FRAME_MAE, f"a frame differs by {errors.max():.2f} on average"
    assert errors.mean() <= MEAN_MAE, f"frames differ by {errors.mean():.2f} on average"
    return float(errors.mean())
