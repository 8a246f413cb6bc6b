"""What an imported network must pass before it is stored, and the forms it is stored in.

Its tensors are mapped to the task's observation and action entries (:func:`tensor_mapping`,
names from the task's spec or 0-based indices, checked against the graph's declared tensors),
an image input to a camera of the task (:mod:`stages.training.import_images`); a network
already ``obs`` (batch, obs_dim) (and ``<camera>_image``, uint8 HWC) -> ``actions`` (batch,
act_dim) in the task's order is kept as given (:func:`in_task_form`), any other wrapped to that
form (:func:`stored_form`). The stored policy runs on probe observations
(:func:`probe_observations`, :func:`probe_actions`: a wrong width or a NaN action is one line),
its parity with the source runtime is checked (:func:`source_parity`), native actions are mapped
to the normalized convention inside the graph (:func:`normalized_onnx`), and a policy declared
normalized must keep its probe actions within -1..1 (:func:`check_normalized`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.core.units import ActionRange
from stages.policies.local import PolicyFn, onnx_actor
from stages.sim.env.observation import STATE_KEY
from stages.training.import_images import (
    ImageInput,
    ImageLayout,
    ImageRange,
    camera_keys,
    image_input,
    source_frames,
    suggested_mapping,
    wrap_seeing,
)
from stages.training.import_sources import Where

if TYPE_CHECKING:
    import onnx

    from edge.export import GraphPort
    from stages.sim.tasks.catalog import TaskSpec

PROBES = 64
"""Random observations (standard normal) the imported policy is run on, besides all zeros."""
RANGE_TOLERANCE = 1e-6
"""How far past -1..1 a probe action of a policy declared normalized may reach (rounding)."""
NATIVE_PREFIX = "native/"
"""Prefix of every name of a native policy's graph inside its normalized wrapper."""
Entry = int | str
"""A task observation or action entry: its name in the task's spec, or its 0-based index."""


def resolve_entries(
    entries: tuple[Entry, ...], names: tuple[str, ...], what: str, where: Where
) -> list[int]:
    """Indices of ``entries`` (names of ``names`` or 0-based indices) in the task's order."""
    out = []
    for entry in entries:
        if isinstance(entry, int):
            if not 0 <= entry < len(names):
                raise where.error(entry, f"{what} index out of range: the task has "
                                  f"{len(names)} {what} entries (0-{len(names) - 1})")
            out.append(entry)
        elif entry in names:
            out.append(names.index(entry))
        else:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise where.error(entry, f"no {what} entry of that name; the task's: {shown}")
    return out


@dataclass(frozen=True)
class TensorMapping:
    """The imported graph's tensors as the task's observations and actions."""

    inputs: dict[str, list[int]]
    """Each state input of the graph -> the task's observation indices of its columns."""
    outputs: list[tuple[str, list[int]]]
    """Each output of the graph that drives actions -> the task's action indices of its
    columns, in the graph's order."""
    images: tuple[ImageInput, ...] = ()
    """Each image input of the graph and the camera frame it is fed."""


def tensor_mapping(
    given_inputs: Mapping[str, tuple[Entry, ...] | str] | None,
    given_outputs: Mapping[str, tuple[Entry, ...]] | None, model: onnx.ModelProto,
    spec: TaskSpec, where: Where, *, layouts: Mapping[str, ImageLayout] | None = None,
    ranges: Mapping[str, ImageRange] | None = None,
) -> TensorMapping:
    """The inputs and outputs of ``model`` as the task's observations and actions, checked
    against the graph's declared tensors (state inputs float of rank 2 with the mapped width,
    image inputs as :func:`~stages.training.import_images.image_input` says, outputs float of
    rank 2); ``given_inputs`` and ``given_outputs`` are the import's mapping (None: the
    default), ``layouts`` and ``ranges`` the image layouts and pixel ranges stated by input."""
    from edge.export import graph_ports

    ins, outs = graph_ports(model)
    at_in, at_out = where.beside("inputs"), where.beside("outputs")
    inputs, keys = _input_mapping(given_inputs, ins, spec, at_in)
    if given_outputs is None:
        named = [p for p in outs if p.name == "actions"]
        chosen = named or (list(outs) if len(outs) == 1 else [])
        if not chosen:
            raise at_out.error([p.name for p in outs], "the policy has several outputs and none "
                               "is named 'actions'; map the ones that drive the task's actions")
        outputs = [(chosen[0].name, list(range(spec.act_dim)))]
    else:
        outputs = [(name, resolve_entries(e, spec.action_names, "action", at_out))
                   for name, e in given_outputs.items()]
    _check_ports(ins, inputs, at_in, where, "input", "observation")
    _check_ports(outs, dict(outputs), at_out, where, "output", "action")
    driven = sorted(j for _, cols in outputs for j in cols)
    if driven != list(range(spec.act_dim)):
        raise at_out.error(driven, f"the outputs must drive each of the task's {spec.act_dim} "
                           "actions exactly once")
    return TensorMapping(inputs, outputs, _images(ins, keys, spec, where, layouts or {},
                                                   ranges or {}))


def _input_mapping(
    given: Mapping[str, tuple[Entry, ...] | str] | None, ins: tuple[GraphPort, ...],
    spec: TaskSpec, at: Where,
) -> tuple[dict[str, list[int]], dict[str, str]]:
    """The state inputs of the graph (name -> observation indices) and its image inputs (name
    -> the task's ``<camera>_image``): as ``given`` maps them, a string naming a task tensor
    (``obs``, every state entry in order, or a camera image) and a list naming state entries;
    inputs named as the task's tensors map themselves; a single input left unmapped takes the
    whole state. An input left unmapped otherwise is one line suggesting a mapping."""
    cameras = camera_keys(spec)
    everything = list(range(spec.obs_dim))
    names = [p.name for p in ins]
    if given is None and len(ins) == 1 and names[0] not in cameras:
        return {names[0]: everything}, {}
    state: dict[str, list[int]] = {}
    keys: dict[str, str] = {}
    for name, value in (given or {}).items():
        if name not in names:
            raise at.error(name, f"the policy has no input of that name; its inputs: "
                           f"{', '.join(names)}")
        if not isinstance(value, str):
            state[name] = resolve_entries(value, spec.obs_names, "observation", at)
        elif value == STATE_KEY:
            state[name] = everything
        elif value in cameras:
            keys[name] = value
        else:
            raise at.error(value, f"task {spec.name} has no observation tensor of that name; "
                           f"its tensors: {', '.join([STATE_KEY, *cameras])} (a list names "
                           "state entries)")
    for name in names:
        if name not in state and name not in keys and name == STATE_KEY:
            state[name] = everything
        elif name not in state and name not in keys and name in cameras:
            keys[name] = name
    unmapped = [p for p in ins if p.name not in state and p.name not in keys]
    if unmapped:
        hint = suggested_mapping(unmapped, spec)
        said = (f"; e.g. inputs: {{{', '.join(f'{k}: {v}' for k, v in hint.items())}}} (on "
                f"the command line: {' '.join(f'--input {k}={v}' for k, v in hint.items())})"
                if hint else "")
        raise at.error([p.name for p in unmapped], "map each input of the policy to the task's "
                       f"observation: {STATE_KEY} (the state), a camera image "
                       f"({', '.join(cameras) or 'the task has none'}) or a list of state "
                       f"entries{said}")
    return state, keys


def _images(
    ins: tuple[GraphPort, ...], keys: dict[str, str], spec: TaskSpec, where: Where,
    layouts: Mapping[str, ImageLayout], ranges: Mapping[str, ImageRange],
) -> tuple[ImageInput, ...]:
    """Each image input of ``keys`` read from the graph and checked (:func:`image_input`); a
    layout or range stated for an input that is no image input is one line."""
    for stated, name in ((layouts, "image_layout"), (ranges, "image_range")):
        strays = sorted(set(stated) - set(keys))
        if strays:
            raise where.beside(name).error(strays, "no image input of the policy has that "
                                           f"name; its image inputs: {', '.join(keys) or 'none'}")
    by_name = {p.name: p for p in ins}
    return tuple(image_input(by_name[name], key, spec, layouts.get(name), ranges.get(name),
                             where) for name, key in keys.items())


def _check_ports(
    ports: tuple[GraphPort, ...], mapped: dict[str, list[int]], at: Where, where: Where,
    kind: str, what: str,
) -> None:
    """Every mapped tensor exists, is float of rank 2, and declares the mapped width."""
    by_name = {p.name: p for p in ports}
    for name in mapped:
        if name not in by_name:
            raise at.error(name, f"the policy has no {kind} of that name; its {kind}s: "
                           f"{', '.join(by_name)}")
    for name, cols in mapped.items():
        port = by_name[name]
        if port.dtype != "FLOAT" or len(port.shape) != 2:
            raise where.error(f"{name}: {port.dtype} {list(port.shape)}", f"{kind} {name!r} "
                              "must be a float32 tensor of shape (batch, entries)")
        width = port.shape[1]
        if isinstance(width, int) and width != len(cols):
            raise where.error(width, f"wrong {kind} width: {kind} {name!r} has {width} entries "
                              f"and is given {len(cols)} task {what} entries")


def in_task_form(model: onnx.ModelProto, mapping: TensorMapping, spec: TaskSpec) -> bool:
    """Whether ``model`` already is ``obs`` (and any ``<camera>_image`` uint8 HWC) ->
    ``actions`` in the task's order."""
    from edge.export import graph_ports
    from edge.session import INPUT_NAME, OUTPUT_NAME

    ins, outs = graph_ports(model)
    return (sorted(p.name for p in ins) == sorted([INPUT_NAME, *(i.name for i in mapping.images)])
            and [p.name for p in outs] == [OUTPUT_NAME]
            and all(image.as_given for image in mapping.images)
            and mapping.inputs == {INPUT_NAME: list(range(spec.obs_dim))}
            and mapping.outputs == [(OUTPUT_NAME, list(range(spec.act_dim)))])


def stored_form(
    model: onnx.ModelProto, mapping: TensorMapping, spec: TaskSpec, path: Path, where: Where,
    source: str,
) -> bytes:
    """``model`` wrapped, its network untouched, to read ``obs`` (and a policy that sees, each
    ``<camera>_image``) and write ``actions`` in the task's order (:func:`edge.export.wrap_io`,
    :func:`~stages.training.import_images.wrap_seeing`); a graph that fails the ONNX checker
    so is one line."""
    from edge.errors import EdgeError
    from edge.export import wrap_io

    try:
        if mapping.images:
            wrapped = wrap_seeing(model, mapping.inputs, mapping.images, mapping.outputs,
                                  spec.obs_dim, spec.act_dim, path)
        else:
            wrapped = wrap_io(model, mapping.inputs, mapping.outputs, spec.obs_dim,
                              spec.act_dim, path)
    except EdgeError as exc:
        raise where.error(source, str(exc)) from None
    return wrapped.SerializeToString(deterministic=True)


def probe_observations(obs_dim: int, seed: int = 0) -> np.ndarray:
    """All zeros, then :data:`PROBES` standard-normal observations. Shape: (PROBES + 1,
    obs_dim), float32."""
    rng = np.random.default_rng(seed)
    return np.concatenate([np.zeros((1, obs_dim)), rng.standard_normal((PROBES, obs_dim))]) \
        .astype(np.float32)


def _source_actions_onnx(
    model_bytes: bytes, mapping: TensorMapping, obs: np.ndarray,
    frames: Mapping[str, np.ndarray], act_dim: int,
) -> np.ndarray:
    """The source graph run as given by ONNX Runtime (one thread), its state inputs fed the
    mapped columns of ``obs`` and its image inputs the ``frames`` of their camera as they want
    them (:func:`~stages.training.import_images.source_frames`), one row at a time, its outputs
    put in action order. Shape: (N, act_dim)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model_bytes, sess_options=options,
                                           providers=["CPUExecutionProvider"])
    names = [name for name, _ in mapping.outputs]
    seen = {image.name: source_frames(image, frames[image.key]) for image in mapping.images}
    actions = np.empty((len(obs), act_dim), np.float32)
    for i in range(len(obs)):
        row = obs[i : i + 1]
        feed = {name: row[:, cols] for name, cols in mapping.inputs.items()}
        feed.update({name: value[i : i + 1] for name, value in seen.items()})
        got = session.run(names, feed)
        for (_, cols), value in zip(mapping.outputs, got, strict=True):
            actions[i, cols] = np.asarray(value, np.float32).reshape(len(cols))
    return actions


def source_parity(
    model: onnx.ModelProto, source_runtime: PolicyFn | None, mapping: TensorMapping,
    obs: np.ndarray, actions: np.ndarray, *, converted_from: ActionRange | None,
    tolerance: float, where: Where, source: str, frames: Mapping[str, np.ndarray] | None = None,
) -> float:
    """Largest |stored policy - source runtime| over the probe observations ``obs`` (and the
    probe ``frames`` of a policy that sees, by image key): the stored policy's ``actions``
    (N, act_dim) against the source graph run as given by ONNX Runtime, or the TorchScript
    module ``source_runtime``, its actions mapped like the stored ones (``converted_from``).
    Over ``tolerance``, or a source graph that does not run, is one line."""
    if source_runtime is not None:
        (cols,) = mapping.inputs.values()
        expected = source_runtime(obs[:, cols])[:, np.argsort(mapping.outputs[0][1])]
    else:
        try:
            expected = _source_actions_onnx(model.SerializeToString(), mapping, obs,
                                            frames or {}, actions.shape[1])
        except Exception as exc:  # ONNX Runtime's errors derive from Exception directly
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else \
                type(exc).__name__
            raise where.error(source, "the source graph does not run one observation "
                              f"at a time: {first[:200]}") from None
    if converted_from is not None:
        expected = converted_from.to_normalized(expected)
    diff = float(np.abs(expected.astype(np.float64) - actions).max())
    if not diff <= tolerance:
        raise where.error(source, f"the stored policy differs from its source runtime "
                          f"by {diff:.3g} (parity_tolerance {tolerance:g})")
    return diff


def probe_actions(
    path: Path, obs: np.ndarray, spec: TaskSpec, where: Where, value: object,
    frames: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """Actions of the ONNX policy at ``path`` for ``obs`` (and, for one that sees, the camera
    ``frames`` by image key): shape (N, act_dim) and finite, else a one-line error."""
    act: Any = onnx_actor(path)  # a SeeingPolicy where there are frames
    try:
        actions = np.asarray(act({STATE_KEY: obs, **frames} if frames else obs), np.float64)
    except Exception as exc:  # ONNX Runtime's errors derive from Exception directly
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise where.error(value, f"the policy does not run on ({len(obs)}, {spec.obs_dim}) "
                          f"observations{' and their camera images' if frames else ''}: "
                          f"{first[:200]}") from None
    if actions.shape != (len(obs), spec.act_dim):
        raise where.error(value, f"wrong output width: the policy's actions have shape "
                          f"{actions.shape[1:]}, the task takes {spec.act_dim}")
    bad = int((~np.isfinite(actions).all(axis=1)).sum())
    if bad:
        raise where.error(value, f"the policy outputs NaN or infinite actions for {bad} of "
                          f"{len(obs)} probe observations")
    return actions


def check_normalized(actions: np.ndarray, where: Where, source: str) -> None:
    """Refuse a policy declared normalized whose probe actions leave -1..1 (one line)."""
    outside = np.abs(actions) > 1.0 + RANGE_TOLERANCE
    if not outside.any():
        return
    rows = int(outside.any(axis=1).sum())
    peak = float(np.abs(actions).max())
    raise where.error("normalized", f"{source} is declared normalized, but its actions reach "
                      f"{peak:.3g} (outside -1..1) on {rows} of {len(actions)} probe "
                      "observations; a policy acting in the environment's own units is "
                      "action_units native (on the command line: --action-units native)")


def normalized_onnx(raw: bytes, native: ActionRange) -> bytes:
    """The ONNX policy ``raw`` (``obs`` and any image inputs -> ``actions`` in native units, one
    action or a chunk) with its actions mapped to the normalized convention: ``(a - mid) *
    (1 / half_span)`` per entry, in float32 after the network, which is kept unchanged inside
    (its names prefixed ``native/``, its inputs' names kept)."""
    import onnx
    from onnx import compose, helper, numpy_helper

    from edge.session import OUTPUT_NAME

    inner = compose.add_prefix(onnx.load_from_string(raw), NATIVE_PREFIX)
    graph = inner.graph
    inputs = [port.name.removeprefix(NATIVE_PREFIX) for port in graph.input]
    for port in (*graph.input, *graph.output):
        if port.name in (*(NATIVE_PREFIX + n for n in inputs), NATIVE_PREFIX + OUTPUT_NAME):
            port.name = port.name.removeprefix(NATIVE_PREFIX)
    mid, scale, centered = (f"{NATIVE_PREFIX}units/{n}" for n in ("mid", "scale", "centered"))
    nodes = [*(helper.make_node("Identity", [name], [NATIVE_PREFIX + name],
                                name=f"{NATIVE_PREFIX}units/{name}") for name in inputs),
             *graph.node,
             helper.make_node("Sub", [NATIVE_PREFIX + OUTPUT_NAME, mid], [centered],
                              name=f"{NATIVE_PREFIX}units/sub"),
             helper.make_node("Mul", [centered, scale], [OUTPUT_NAME],
                              name=f"{NATIVE_PREFIX}units/mul")]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend([
        numpy_helper.from_array(native.mid.astype(np.float32), mid),
        numpy_helper.from_array(native.inverse_half_span.astype(np.float32), scale)])
    if not any(o.domain in ("", "ai.onnx") for o in inner.opset_import):
        inner.opset_import.append(helper.make_opsetid("", 13))
    onnx.checker.check_model(inner)
    return inner.SerializeToString(deterministic=True)
