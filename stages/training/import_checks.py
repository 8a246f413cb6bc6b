"""What an imported network must pass before it is stored, and the forms it is stored in.

Its tensors are mapped to the task's observation and action entries (:func:`tensor_mapping`,
names from the task's spec or 0-based indices, checked against the graph's declared tensors); a
network already ``obs`` (batch, obs_dim) -> ``actions`` (batch, act_dim) in the task's order is
kept as given (:func:`in_task_form`). The stored policy runs on probe observations
(:func:`probe_observations`, :func:`probe_actions`: a wrong width or a NaN action is one line),
its parity with the source runtime is checked (:func:`source_parity`), native actions are mapped
to the normalized convention inside the graph (:func:`normalized_onnx`), and a policy declared
normalized must keep its probe actions within -1..1 (:func:`check_normalized`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stages.core.units import ActionRange
from stages.policies.local import PolicyFn, onnx_actor
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


def tensor_mapping(
    given_inputs: Mapping[str, tuple[Entry, ...]] | None,
    given_outputs: Mapping[str, tuple[Entry, ...]] | None, model: onnx.ModelProto,
    spec: TaskSpec, where: Where,
) -> tuple[dict[str, list[int]], list[tuple[str, list[int]]]]:
    """The inputs and outputs of ``model`` as task observation and action indices, checked
    against the graph's declared tensors (float, rank 2, widths matching the mapping);
    ``given_inputs`` and ``given_outputs`` are the import's mapping (None: the default)."""
    from edge.export import graph_ports

    ins, outs = graph_ports(model)
    field = where.field.rpartition(".")[0]
    at_in = Where(where.file, f"{field}.inputs" if field else "inputs")
    at_out = Where(where.file, f"{field}.outputs" if field else "outputs")
    if given_inputs is None:
        if len(ins) != 1:
            raise at_in.error([p.name for p in ins], "the policy has several inputs; map each "
                              "to the task's observation entries")
        inputs = {ins[0].name: list(range(spec.obs_dim))}
    else:
        inputs = {name: resolve_entries(e, spec.obs_names, "observation", at_in)
                  for name, e in given_inputs.items()}
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
    return inputs, outputs


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
    unmapped = sorted(set(by_name) - set(mapped))
    if kind == "input" and unmapped:
        raise at.error(unmapped, "every input of the policy needs observation entries")
    for name, cols in mapped.items():
        port = by_name[name]
        if port.dtype != "FLOAT" or len(port.shape) != 2:
            raise where.error(f"{name}: {port.dtype} {list(port.shape)}", f"{kind} {name!r} "
                              "must be a float32 tensor of shape (batch, entries)")
        width = port.shape[1]
        if isinstance(width, int) and width != len(cols):
            raise where.error(width, f"wrong {kind} width: {kind} {name!r} has {width} entries "
                              f"and is given {len(cols)} task {what} entries")


def in_task_form(
    model: onnx.ModelProto, inputs: dict[str, list[int]], outputs: list[tuple[str, list[int]]],
    spec: TaskSpec,
) -> bool:
    """Whether ``model`` already is ``obs`` -> ``actions`` in the task's order."""
    from edge.export import graph_ports
    from edge.session import INPUT_NAME, OUTPUT_NAME

    ins, outs = graph_ports(model)
    return ([p.name for p in ins] == [INPUT_NAME] and [p.name for p in outs] == [OUTPUT_NAME]
            and inputs == {INPUT_NAME: list(range(spec.obs_dim))}
            and outputs == [(OUTPUT_NAME, list(range(spec.act_dim)))])


def probe_observations(obs_dim: int, seed: int = 0) -> np.ndarray:
    """All zeros, then :data:`PROBES` standard-normal observations. Shape: (PROBES + 1,
    obs_dim), float32."""
    rng = np.random.default_rng(seed)
    return np.concatenate([np.zeros((1, obs_dim)), rng.standard_normal((PROBES, obs_dim))]) \
        .astype(np.float32)


def _source_actions_onnx(
    model_bytes: bytes, inputs: dict[str, list[int]], outputs: list[tuple[str, list[int]]],
    obs: np.ndarray, act_dim: int,
) -> np.ndarray:
    """The source graph run as given by ONNX Runtime (one thread), its inputs fed the mapped
    columns of ``obs`` one row at a time, its outputs put in action order. Shape: (N, act_dim).
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model_bytes, sess_options=options,
                                           providers=["CPUExecutionProvider"])
    names = [name for name, _ in outputs]
    actions = np.empty((len(obs), act_dim), np.float32)
    for i in range(len(obs)):
        row = obs[i : i + 1]
        got = session.run(names, {name: row[:, cols] for name, cols in inputs.items()})
        for (_, cols), value in zip(outputs, got, strict=True):
            actions[i, cols] = np.asarray(value, np.float32).reshape(len(cols))
    return actions


def source_parity(
    model: onnx.ModelProto, source_runtime: PolicyFn | None, inputs: dict[str, list[int]],
    outputs: list[tuple[str, list[int]]], obs: np.ndarray, actions: np.ndarray, *,
    converted_from: ActionRange | None, tolerance: float, where: Where, source: str,
) -> float:
    """Largest |stored policy - source runtime| over the probe observations ``obs``: the stored
    policy's ``actions`` (N, act_dim) against the source graph run as given by ONNX Runtime, or
    the TorchScript module ``source_runtime``, its actions mapped like the stored ones
    (``converted_from``). Over ``tolerance``, or a source graph that does not run, is one line."""
    if source_runtime is not None:
        (cols,) = inputs.values()
        expected = source_runtime(obs[:, cols])[:, np.argsort(outputs[0][1])]
    else:
        try:
            expected = _source_actions_onnx(model.SerializeToString(), inputs, outputs,
                                            obs, actions.shape[1])
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
    path: Path, obs: np.ndarray, spec: TaskSpec, where: Where, value: object
) -> np.ndarray:
    """Actions of the ONNX policy at ``path`` for ``obs``: shape (N, act_dim) and finite, else
    a one-line error."""
    act = onnx_actor(path)
    try:
        actions = np.asarray(act(obs), np.float64)
    except Exception as exc:  # ONNX Runtime's errors derive from Exception directly
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise where.error(value, f"the policy does not run on ({len(obs)}, {spec.obs_dim}) "
                          f"observations: {first[:200]}") from None
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
