"""Export a torch policy to ONNX with fixed I/O names, a dynamic batch axis and checked shapes."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from edge.errors import EdgeError, one_line
from edge.files import write_bytes_atomic
from edge.policy import inference
from edge.session import INPUT_NAME, OUTPUT_NAME

if TYPE_CHECKING:
    import onnx
    import torch

BATCH_AXIS = "batch"
"""Symbolic name of the dynamic batch dimension on ``obs`` and ``actions``."""

_TRACE_BATCH = 2
"""Batch size of the example input used for tracing; above 1 so no op specialises on it."""


def export_onnx(module: torch.nn.Module, obs_dim: int, path: Path, *, opset: int = 17) -> Path:
    """Export ``module`` to an ONNX file at ``path`` and return ``path``.

    ``module`` maps observations to actions and already contains the observation normalizer.
    Shape: (batch, obs_dim) float32 -> (batch, act_dim) float32. The graph has one input
    ``obs`` and one output ``actions`` with a dynamic batch axis. It is traced in eval mode
    without autograd (the module's training flags are restored afterwards), checked with
    ``onnx.checker`` (full check) and shape inference, and written atomically. The same
    weights and toolchain give byte-identical files.

    Raises :class:`EdgeError` when the module does not produce a (batch, act_dim) float32
    tensor, when tracing fails, or when the exported graph does not pass the checks.
    """
    import torch

    if obs_dim < 1:
        raise EdgeError(f"{path}: obs_dim must be at least 1 (value: {obs_dim})")
    with inference(module) as device:
        example = torch.zeros(_TRACE_BATCH, obs_dim, dtype=torch.float32, device=device)
        act_dim = _act_dim(module, example, path)
        with tempfile.TemporaryDirectory(prefix="physai-export-") as scratch:
            raw = Path(scratch) / "policy.onnx"
            _trace(module, example, raw, opset, path)
            data = raw.read_bytes()
    model = _checked(data, obs_dim, act_dim, path)
    write_bytes_atomic(path, model.SerializeToString(deterministic=True))
    return path


def _trace(
    module: torch.nn.Module, example: torch.Tensor, raw: Path, opset: int, path: Path
) -> None:
    """Trace ``module`` on ``example`` into the ONNX file ``raw`` with the legacy exporter.

    The TorchScript-based exporter (``dynamo=False``) is used because it is fast and writes
    the requested opset (17 by default); its deprecation notice is silenced for this call only.
    """
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                module,
                (example,),
                raw,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: BATCH_AXIS}, OUTPUT_NAME: {0: BATCH_AXIS}},
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as exc:  # the exporter raises many unrelated types
        raise EdgeError(f"{path}: ONNX export failed: {one_line(exc)}") from exc


def _act_dim(module: torch.nn.Module, example: torch.Tensor, path: Path) -> int:
    """Run ``module`` once on ``example`` and return the action size it produces."""
    import torch

    try:
        actions = module(example)
    except Exception as exc:  # arbitrary user module code
        raise EdgeError(f"{path}: policy forward failed: {one_line(exc)}") from exc
    if not isinstance(actions, torch.Tensor):
        raise EdgeError(f"{path}: policy must return a tensor (value: {type(actions).__name__})")
    if actions.dtype != torch.float32 or actions.ndim != 2 or actions.shape[0] != _TRACE_BATCH:
        raise EdgeError(
            f"{path}: policy output must be float32 of shape (batch, act_dim) "
            f"(value: {actions.dtype} {tuple(actions.shape)} for batch {_TRACE_BATCH})"
        )
    return int(actions.shape[1])


def _checked(data: bytes, obs_dim: int, act_dim: int, path: Path) -> onnx.ModelProto:
    """Parse, fully check and shape-infer an exported graph, and check its I/O signature."""
    import onnx

    try:
        model = onnx.load_from_string(data)
        onnx.checker.check_model(model, full_check=True)
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise EdgeError(f"{path}: exported graph fails the ONNX checker: {one_line(exc)}") from exc
    expected: dict[str, list[object]] = {
        INPUT_NAME: ["FLOAT", BATCH_AXIS, obs_dim],
        OUTPUT_NAME: ["FLOAT", BATCH_AXIS, act_dim],
    }
    found: dict[str, list[object]] = {
        value.name: [
            onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type),
            *(dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim),
        ]
        for value in (*model.graph.input, *model.graph.output)
    }
    if found != expected:
        raise EdgeError(f"{path}: exported I/O must be {expected} (value: {found})")
    return model
