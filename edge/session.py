"""ONNX Runtime sessions over exported policies: the fixed I/O names and CPU session setup."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge.errors import EdgeError, one_line

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime

INPUT_NAME = "obs"
"""Name of the policy graph's single input. Shape: (batch, obs_dim), float32."""

OUTPUT_NAME = "actions"
"""Name of the policy graph's single output. Shape: (batch, act_dim), float32."""

CPU_PROVIDER = "CPUExecutionProvider"
"""ONNX Runtime execution provider used off the robot."""


@dataclass(frozen=True)
class PolicySession:
    """An ONNX Runtime session over an exported policy, with its feature sizes."""

    session: onnxruntime.InferenceSession
    obs_dim: int
    act_dim: int
    provider: str

    def run(self, obs: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations. Shape: (batch, obs_dim) -> (batch, act_dim)."""
        actions: np.ndarray = self.session.run([OUTPUT_NAME], {INPUT_NAME: obs})[0]
        return actions


def open_session(onnx_path: Path, *, threads: int = 1) -> PolicySession:
    """Open ``onnx_path`` on the CPU provider with ``threads`` intra-op threads, run sequentially.

    Raises :class:`EdgeError` when the file is missing, cannot be loaded, or does not map one
    float tensor ``obs`` of shape (batch, obs_dim) to one float tensor ``actions`` of shape
    (batch, act_dim) with fixed feature sizes.
    """
    import onnxruntime

    if threads < 1:
        raise EdgeError(f"{onnx_path}: threads must be at least 1 (value: {threads})")
    if not onnx_path.is_file():
        raise EdgeError(f"{onnx_path}: ONNX file not found")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    try:
        session = onnxruntime.InferenceSession(
            str(onnx_path), sess_options=options, providers=[CPU_PROVIDER]
        )
    except Exception as exc:  # ONNX Runtime's error types derive from Exception directly.
        raise EdgeError(f"{onnx_path}: ONNX Runtime cannot load it: {one_line(exc)}") from exc
    obs_dim = _feature_dim(onnx_path, session.get_inputs(), INPUT_NAME, "input")
    act_dim = _feature_dim(onnx_path, session.get_outputs(), OUTPUT_NAME, "output")
    return PolicySession(session, obs_dim, act_dim, session.get_providers()[0])


def _feature_dim(onnx_path: Path, args: list[onnxruntime.NodeArg], name: str, kind: str) -> int:
    """Fixed second dimension of the single graph ``kind`` named ``name``, checked for type."""
    names = [arg.name for arg in args]
    if names != [name]:
        raise EdgeError(f"{onnx_path}: graph {kind}s must be [{name!r}] (value: {names})")
    arg = args[0]
    if arg.type != "tensor(float)":
        raise EdgeError(f"{onnx_path}: {kind} {name!r} must be tensor(float) (value: {arg.type})")
    shape = arg.shape
    if len(shape) != 2 or not isinstance(shape[1], int):
        raise EdgeError(
            f"{onnx_path}: {kind} {name!r} must have shape (batch, features) with a fixed "
            f"feature size (value: {shape})"
        )
    return shape[1]
