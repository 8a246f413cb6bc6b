"""Export a torch policy to ONNX with fixed I/O names, a dynamic batch axis and checked shapes;
give a policy exported elsewhere those I/O names without touching its network.

A state policy's graph maps ``obs`` (batch, obs_dim) float32 to ``actions`` (batch, act_dim)
float32; one that emits chunks of k actions to ``actions`` (batch, k, act_dim). A policy
that sees also reads one uint8 input per camera image, ``<camera>_image`` (batch, H, W, 3)
RGB HWC, after ``obs`` in the order its forward takes them.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge.errors import EdgeError
from edge.files import write_bytes_atomic
from edge.policy import inference
from edge.session import INPUT_NAME, OUTPUT_NAME
from physai_core.errors import one_line

if TYPE_CHECKING:
    import onnx
    import torch

BATCH_AXIS = "batch"
"""Symbolic name of the dynamic batch dimension on every input and output."""

_TRACE_BATCH = 2
"""Batch size of the example input used for tracing; above 1 so no op specialises on it."""


def export_onnx(
    module: torch.nn.Module,
    obs_dim: int,
    path: Path,
    *,
    opset: int = 17,
    images: Mapping[str, tuple[int, int, int]] | None = None,
) -> Path:
    """Export ``module`` to an ONNX file at ``path`` and return ``path``.

    ``module`` maps observations to actions and already contains the observation normalizer
    (and, for a policy that sees, the image scaling). Shape: obs (batch, obs_dim) float32,
    then each of ``images`` (name -> (H, W, 3)) as (batch, H, W, 3) uint8, positionally in
    that order -> (batch, act_dim) float32, or a chunk of the next k actions (batch, k,
    act_dim) for a policy that emits chunks. The graph has the inputs ``obs`` and each image's
    name, and one output ``actions``, all with a dynamic batch axis. It is traced in eval mode
    without autograd (the module's training flags are restored afterwards), checked with
    ``onnx.checker`` (full check) and shape inference, and written atomically. The same
    weights and toolchain give byte-identical files.

    Raises :class:`EdgeError` when the module does not produce a (batch, act_dim) or (batch,
    k, act_dim) float32 tensor, when tracing fails, or when the exported graph does not pass
    the checks (an image input the network ignores is dropped by the exporter and so refused).
    """
    import torch

    if obs_dim < 1:
        raise EdgeError(f"{path}: obs_dim must be at least 1 (value: {obs_dim})")
    frames = {name: tuple(int(d) for d in shape) for name, shape in (images or {}).items()}
    bad = {name: shape for name, shape in frames.items()
           if name == INPUT_NAME or len(shape) != 3 or shape[2] != 3 or min(shape) < 1}
    if bad:
        raise EdgeError(f"{path}: image inputs must be named apart from {INPUT_NAME!r} and "
                        f"shaped (H, W, 3) (value: {bad})")
    with inference(module) as device:
        example = (torch.zeros(_TRACE_BATCH, obs_dim, dtype=torch.float32, device=device),
                   *(torch.zeros(_TRACE_BATCH, *shape, dtype=torch.uint8, device=device)
                     for shape in frames.values()))
        action_shape = _action_shape(module, example, path)
        with tempfile.TemporaryDirectory(prefix="physai-export-") as scratch:
            raw = Path(scratch) / "policy.onnx"
            _trace(module, example, (INPUT_NAME, *frames), raw, opset, path)
            data = raw.read_bytes()
    expected: dict[str, list[object]] = {
        INPUT_NAME: ["FLOAT", BATCH_AXIS, obs_dim],
        **{name: ["UINT8", BATCH_AXIS, *shape] for name, shape in frames.items()},
        OUTPUT_NAME: ["FLOAT", BATCH_AXIS, *action_shape],
    }
    model = _checked(data, expected, path)
    write_bytes_atomic(path, model.SerializeToString(deterministic=True))
    return path


def _trace(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    names: Sequence[str],
    raw: Path,
    opset: int,
    path: Path,
) -> None:
    """Trace ``module`` on the inputs ``example``, named ``names``, into the ONNX file ``raw``
    with the legacy exporter.

    The TorchScript-based exporter (``dynamo=False``) is used because it is fast and writes
    the requested opset (17 by default); its deprecation notice is silenced for this call only.
    """
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                module,
                example,
                raw,
                input_names=list(names),
                output_names=[OUTPUT_NAME],
                dynamic_axes={name: {0: BATCH_AXIS} for name in (*names, OUTPUT_NAME)},
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as exc:  # the exporter raises many unrelated types
        raise EdgeError(f"{path}: ONNX export failed: {one_line(exc)}") from exc


def _action_shape(module: torch.nn.Module, example: tuple[torch.Tensor, ...], path: Path
                  ) -> tuple[int, ...]:
    """Run ``module`` once on the inputs ``example`` and return the shape of one sample's
    actions: (act_dim,), or (k, act_dim) for a policy that emits chunks of k actions."""
    import torch

    try:
        actions = module(*example)
    except Exception as exc:  # arbitrary user module code
        raise EdgeError(f"{path}: policy forward failed: {one_line(exc)}") from exc
    if not isinstance(actions, torch.Tensor):
        raise EdgeError(f"{path}: policy must return a tensor (value: {type(actions).__name__})")
    if actions.dtype != torch.float32 or actions.ndim not in (2, 3) or \
            actions.shape[0] != _TRACE_BATCH:
        raise EdgeError(
            f"{path}: policy output must be float32 of shape (batch, act_dim) (value: "
            f"{actions.dtype} {tuple(actions.shape)} for batch {_TRACE_BATCH}); a chunk of k "
            f"actions: (batch, k, act_dim)"
        )
    return tuple(int(d) for d in actions.shape[1:])


def _checked(data: bytes, expected: dict[str, list[object]], path: Path) -> onnx.ModelProto:
    """Parse, fully check and shape-infer an exported graph, and check its I/O signature:
    ``expected`` gives each input, then the output, with its element type and dimensions."""
    import onnx

    try:
        model = onnx.load_from_string(data)
        onnx.checker.check_model(model, full_check=True)
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise EdgeError(f"{path}: exported graph fails the ONNX checker: {one_line(exc)}") from exc
    found: dict[str, list[object]] = {
        value.name: [
            onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type),
            *(dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim),
        ]
        for value in (*model.graph.input, *model.graph.output)
    }
    if list(found.items()) != list(expected.items()):
        raise EdgeError(f"{path}: exported I/O must be {expected} (value: {found})")
    return model


@dataclass(frozen=True)
class GraphPort:
    """One input or output tensor of an ONNX graph as it is declared."""

    name: str
    """Tensor name."""
    dtype: str
    """Element type as ONNX names it, e.g. ``FLOAT``."""
    shape: tuple[int | str | None, ...]
    """Declared dimensions: a size, a symbolic name, or None when undeclared."""


def graph_ports(model: onnx.ModelProto) -> tuple[tuple[GraphPort, ...], tuple[GraphPort, ...]]:
    """The graph's real inputs (initializers left out) and its outputs, in declared order."""
    import onnx

    weights = {t.name for t in model.graph.initializer}

    def port(value: onnx.ValueInfoProto) -> GraphPort:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in tensor.shape.dim)
        return GraphPort(value.name, onnx.TensorProto.DataType.Name(tensor.elem_type), dims)

    inputs = tuple(port(v) for v in model.graph.input if v.name not in weights)
    return inputs, tuple(port(v) for v in model.graph.output)


def model_opset(model: onnx.ModelProto) -> int:
    """The opset of the default ONNX domain that ``model`` imports."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


@dataclass(frozen=True)
class ImageFeed:
    """A camera input of a wrapped graph, ``key`` uint8 (batch, H, W, 3), and the nodes (with
    their constant tensors) that turn it into what the wrapped model's image input reads."""

    key: str
    size: tuple[int, int]
    """(H, W) of one frame."""
    nodes: Sequence[onnx.NodeProto]
    weights: Sequence[onnx.TensorProto]


def wrap_io(
    model: onnx.ModelProto,
    inputs: Mapping[str, Sequence[int]],
    outputs: Sequence[tuple[str, Sequence[int]]],
    obs_dim: int,
    act_dim: int,
    path: Path,
    images: Sequence[ImageFeed] = (),
) -> onnx.ModelProto:
    """``model`` inside a graph with this project's I/O: ``obs`` (batch, obs_dim) (and, for a
    policy that sees, each of ``images``: ``<camera>_image`` (batch, H, W, 3) uint8) ->
    ``actions`` (batch, act_dim), the network's own nodes and weights left as they are.

    ``inputs`` gives, for each input tensor of ``model``, the columns of ``obs`` it receives, in
    its order (a ``Gather`` along axis 1); each image feed's nodes write the model's image
    input (``src/<name>``). ``outputs`` gives, for each output tensor of ``model`` in turn, the
    action entries its columns drive; together they drive every one of the ``act_dim``
    actions exactly once, and the concatenated columns are put in action order by one
    ``Gather``. Every name of ``model`` is prefixed with ``src/`` so nothing clashes. The batch
    dimension is the one the first input declares (a symbolic ``batch`` unless the model fixes
    it). Raises :class:`EdgeError` naming ``path`` when the wrapped graph fails the ONNX
    checker.
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    driven = [int(j) for _, cols in outputs for j in cols]
    if sorted(driven) != list(range(act_dim)):
        raise EdgeError(f"{path}: the outputs must drive each of the {act_dim} actions once "
                        f"(value: {driven})")
    src = onnx.compose.add_prefix(model, "src/")
    first = graph_ports(model)[0][0].shape
    batch: int | str = first[0] if first and isinstance(first[0], int) else BATCH_AXIS
    weights = list(src.graph.initializer)
    nodes = []
    for name, cols in inputs.items():
        index = f"io/obs_columns/{name}"
        weights.append(numpy_helper.from_array(np.asarray(cols, np.int64), index))
        nodes.append(helper.make_node("Gather", [INPUT_NAME, index], [f"src/{name}"], axis=1,
                                      name=f"io/gather/{name}"))
    for feed in images:
        nodes += feed.nodes
        weights += feed.weights
    nodes.extend(src.graph.node)
    produced = [f"src/{name}" for name, _ in outputs]
    joined = produced[0]
    if len(produced) > 1:
        joined = "io/concat"
        nodes.append(helper.make_node("Concat", produced, [joined], axis=1, name="io/concat"))
    order = "io/action_columns"
    weights.append(numpy_helper.from_array(np.argsort(driven).astype(np.int64), order))
    nodes.append(helper.make_node("Gather", [joined, order], [OUTPUT_NAME], axis=1,
                                  name="io/gather/actions"))
    graph = helper.make_graph(
        nodes, model.graph.name or "policy",
        [helper.make_tensor_value_info(INPUT_NAME, onnx.TensorProto.FLOAT, [batch, obs_dim]),
         *(helper.make_tensor_value_info(feed.key, onnx.TensorProto.UINT8,
                                         [batch, *feed.size, 3]) for feed in images)],
        [helper.make_tensor_value_info(OUTPUT_NAME, onnx.TensorProto.FLOAT, [batch, act_dim])],
        initializer=weights)
    wrapped = helper.make_model(graph, opset_imports=list(model.opset_import),
                                ir_version=model.ir_version,
                                producer_name=model.producer_name or "physai-flows")
    wrapped.functions.extend(src.functions)
    io = "obs/<camera>_image/actions" if images else "obs/actions"
    try:
        onnx.checker.check_model(wrapped, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise EdgeError(f"{path}: the policy with {io} I/O fails the ONNX checker: "
                        f"{one_line(exc)}") from exc
    return wrapped
