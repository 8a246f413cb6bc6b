"""Parity between a torch policy and its ONNX export, on real and out-of-distribution inputs.

A policy that sees is compared on mappings of its named inputs: the state ``obs`` (N, obs_dim)
float32 and each camera image ``<camera>_image`` (N, H, W, 3) uint8, e.g. frames its task's
cameras rendered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge.errors import EdgeError
from edge.policy import inference
from edge.session import INPUT_NAME, PolicySession, open_session

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
    obs: np.ndarray | Mapping[str, np.ndarray],
    *,
    tolerance: float,
    batch_size: int = 1024,
) -> ParityReport:
    """Run ``module`` (torch, eval mode) and ``onnx_path`` (ONNX Runtime CPU, one thread) on
    the same observations and compare the actions element-wise.

    ``obs`` has shape (samples, obs_dim) and is cast to float32; both sides see it in batches
    of ``batch_size``. For a policy that sees, ``obs`` maps every graph input to its samples
    (``obs`` as above, each image (samples, H, W, 3) uint8); the module is called with them
    positionally in its ``inputs`` order (the graph's input order when it has none). A
    non-finite action on either side counts as an infinite difference. The report passes
    when the largest absolute difference is at most ``tolerance``.
    """
    import torch

    if not math.isfinite(tolerance) or tolerance < 0:
        raise EdgeError(
            f"{onnx_path}: parity tolerance must be finite and >= 0 (value: {tolerance})"
        )
    if batch_size < 1:
        raise EdgeError(f"{onnx_path}: parity batch_size must be at least 1 (value: {batch_size})")
    session = open_session(onnx_path, threads=1)
    inputs = parity_inputs(onnx_path, session, obs)
    order = tuple(getattr(module, "inputs", None) or session.inputs)
    samples = len(inputs[INPUT_NAME])
    diffs = []
    with inference(module) as device:
        for start in range(0, samples, batch_size):
            chunk = {name: array[start : start + batch_size] for name, array in inputs.items()}
            expected = module(*(torch.from_numpy(chunk[name]).to(device) for name in order)
                              ).cpu().numpy()
            actual = session.run(chunk if session.images else chunk[INPUT_NAME])
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
        samples=samples,
        tolerance=tolerance,
        passed=max_abs <= tolerance,
    )


def parity_inputs(onnx_path: Path, session: PolicySession,
                  obs: np.ndarray | Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every input of ``session``'s graph by name, checked: the state (samples >= 1,
    obs_dim) as contiguous float32, each image (samples, H, W, 3) uint8 at the graph's size.
    ``obs`` is the state alone for a state policy, else a mapping holding every input."""
    given = obs if isinstance(obs, Mapping) else {INPUT_NAME: obs}
    missing = [name for name in session.inputs if name not in given]
    if missing:
        raise EdgeError(f"{onnx_path}: parity inputs lack {missing} (the model reads "
                        f"{list(session.inputs)})")
    state = np.array(given[INPUT_NAME], dtype=np.float32, order="C")
    if state.ndim != 2 or state.shape[0] == 0 or state.shape[1] != session.obs_dim:
        raise EdgeError(
            f"{onnx_path}: parity observations must have shape (samples >= 1, "
            f"{session.obs_dim}) (value: {state.shape})"
        )
    inputs = {INPUT_NAME: state}
    for name, shape in session.images.items():
        image = np.ascontiguousarray(given[name])
        if image.dtype != np.uint8 or image.shape != (len(state), *shape):
            raise EdgeError(f"{onnx_path}: parity input {name!r} must be uint8 of shape "
                            f"{(len(state), *shape)} (value: {image.dtype} {image.shape})")
        inputs[name] = image
    return inputs


def ood_inputs(sample: Mapping[str, np.ndarray], n: int, seed: int) -> dict[str, np.ndarray]:
    """Out-of-distribution probes of a policy that sees: states from :func:`ood_probes` of
    ``sample["obs"]`` and, for each image input of ``sample``, frames of uniform random
    pixels (noise no camera renders) of its (H, W, 3) size.
    Shape: -> {"obs": (n, obs_dim) float32, name: (n, H, W, 3) uint8}."""
    probes = {INPUT_NAME: ood_probes(sample[INPUT_NAME], n, seed)}
    rng = np.random.default_rng([seed, 1])
    for name, frames in sample.items():
        if name != INPUT_NAME:
            probes[name] = rng.integers(0, 256, (n, *np.shape(frames)[1:]), dtype=np.uint8)
    return probes


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
