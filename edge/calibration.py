"""The calibration set a bundle carries, drawn on the packaging side: the rows of the
observations (and, for a policy that sees, the same rows of its camera frames) that an INT8
engine build on the target calibrates on.

The on-target builder (:mod:`edge.engine`, which ships in the bundle alone) reads the set; this
module, which stays with the packager, draws it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import overload

import numpy as np

from edge.engine import CALIBRATION_SAMPLES, INPUT_NAME, Inputs, calibration_arrays

__all__ = ["draw_calibration_set"]


@overload
def draw_calibration_set(obs: np.ndarray, samples: int = ..., seed: int = ...) -> np.ndarray: ...
@overload
def draw_calibration_set(obs: Inputs, samples: int = ..., seed: int = ...
                         ) -> dict[str, np.ndarray]: ...
def draw_calibration_set(
    obs: np.ndarray | Inputs, samples: int = CALIBRATION_SAMPLES, seed: int = 0
) -> np.ndarray | dict[str, np.ndarray]:
    """``samples`` rows of ``obs`` drawn without replacement (all rows when there are fewer),
    in their original order, as contiguous float32. Shape: (N, obs_dim) -> (min(N, samples),
    obs_dim). The same ``obs`` and ``seed`` give the same rows; non-finite rows are refused.

    For a policy that sees, ``obs`` maps every input to its N samples (see :data:`Inputs`);
    the same rows are drawn from each (the rows the state alone would give) and a mapping of
    the same names is returned, the images kept uint8.
    """
    if isinstance(obs, Mapping):
        arrays = calibration_arrays(obs)
        state = draw_calibration_set(arrays[INPUT_NAME], samples, seed)
        rows = _drawn_rows(len(arrays[INPUT_NAME]), samples, seed)
        return {name: state if name == INPUT_NAME else np.ascontiguousarray(array[rows])
                for name, array in arrays.items()}
    obs = np.asarray(obs)
    if obs.ndim != 2 or obs.shape[0] == 0 or obs.shape[1] == 0:
        raise ValueError(f"observations must be a non-empty (N, obs_dim) array "
                         f"(shape: {obs.shape})")
    if samples < 1:
        raise ValueError(f"samples must be at least 1 (value: {samples})")
    if not np.isfinite(obs).all():
        raise ValueError("observations hold NaN or inf; they cannot calibrate an engine")
    return np.ascontiguousarray(obs[_drawn_rows(len(obs), samples, seed)], dtype=np.float32)


def _drawn_rows(count: int, samples: int, seed: int) -> np.ndarray:
    """Indices of ``min(count, samples)`` rows out of ``count`` drawn without replacement from
    ``seed``, sorted."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(count, min(samples, count), replace=False))
