"""Parity between a torch policy and its ONNX export, on real and out-of-distribution inputs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge.errors import EdgeError
from edge.policy import inference
from edge.session import open_session

if TYPE_CHECKING:
    import torch

OOD_SCALE = (3.0, 5.0)
"""Range of distances, in half-widths of the data's range, at which OOD probes are drawn."""


@dataclass(frozen=True)
class ParityReport:
    """Largest and mean absolute action difference between torch and ONNX Runtime."""

    max_abs_diff: float
    """Largest |torch - onnx| over every action element; infinite for a non-finite action."""
    mean_abs_diff: float
    """Mean |torch - onnx| over every action element."""
    samples: int
    """Number of observations compared."""
    tolerance: float
    """Largest difference allowed."""
    passed: bool
    """Whether ``max_abs_diff <= tolerance``."""


def check_parity(
    module: torch.nn.Module,
    onnx_path: Path,
    obs: np.ndarray,
    *,
    tolerance: float,
    batch_size: int = 1024,
) -> ParityReport:
    """Run ``module`` (torch, eval mode) and ``onnx_path`` (ONNX Runtime CPU, one thread) on
    the same observations and compare the actions element-wise.

    ``obs`` has shape (samples, obs_dim) and is cast to float32; both sides see it in batches
    of ``batch_size``. A non-finite action on either side counts as an infinite difference.
    The report passes when the largest absolute difference is at most ``tolerance``.
    """
    import torch

    if not math.isfinite(tolerance) or tolerance < 0:
        raise EdgeError(
            f"{onnx_path}: parity tolerance must be finite and >= 0 (value: {tolerance})"
        )
    if batch_size < 1:
        raise EdgeError(f"{onnx_path}: parity batch_size must be at least 1 (value: {batch_size})")
    session = open_session(onnx_path, threads=1)
    obs = np.array(obs, dtype=np.float32, order="C")
    if obs.ndim != 2 or obs.shape[0] == 0 or obs.shape[1] != session.obs_dim:
        raise EdgeError(
            f"{onnx_path}: parity observations must have shape (samples >= 1, "
            f"{session.obs_dim}) (value: {obs.shape})"
        )
    diffs = []
    with inference(module) as device:
        for start in range(0, len(obs), batch_size):
            chunk = obs[start : start + batch_size]
            expected = module(torch.from_numpy(chunk).to(device)).cpu().numpy()
            actual = session.run(chunk)
            if expected.shape != actual.shape:
                raise EdgeError(
                    f"{onnx_path}: torch and ONNX actions differ in shape "
                    f"(value: {expected.shape} vs {actual.shape})"
                )
            diffs.append(_abs_diff(expected, actual))
    diff = np.concatenate(diffs)
    max_abs = float(diff.max())
    return ParityReport(
        max_abs_diff=max_abs,
        mean_abs_diff=float(diff.mean()),
        samples=len(obs),
        tolerance=tolerance,
        passed=max_abs <= tolerance,
    )


def ood_probes(obs: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Observations far outside the range of ``obs``, for checking parity where data is absent.

    For every dimension the data's range [min, max] has a centre and a half-width (1 for a
    constant dimension). Each probe coordinate lies at a uniform 3-5 half-widths from the
    centre, on a random side, so every coordinate of every probe is out of range.
    Shape: (samples, obs_dim) -> (n, obs_dim), float32; the same ``seed`` gives the same probes.
    """
    data = np.asarray(obs, dtype=np.float64)
    if data.ndim != 2 or data.shape[0] == 0 or not np.isfinite(data).all():
        raise EdgeError(
            f"OOD probes need finite observations of shape (samples >= 1, obs_dim) "
            f"(value: shape {data.shape})"
        )
    if n < 1:
        raise EdgeError(f"OOD probe count must be at least 1 (value: {n})")
    low, high = data.min(axis=0), data.max(axis=0)
    centre = (low + high) / 2
    half = np.where(high > low, (high - low) / 2, 1.0)
    rng = np.random.default_rng(seed)
    shape = (n, data.shape[1])
    distance = rng.uniform(*OOD_SCALE, size=shape)
    side = rng.choice([-1.0, 1.0], size=shape)
    return (centre + side * distance * half).astype(np.float32)


def _abs_diff(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Element-wise |expected - actual| in float64, infinite where either side is non-finite.

    Shape: (batch, act_dim) twice -> (batch, act_dim).
    """
    diff = np.abs(expected.astype(np.float64) - actual.astype(np.float64))
    finite = np.isfinite(expected) & np.isfinite(actual)
    return np.where(finite, diff, np.inf)
