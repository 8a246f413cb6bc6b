"""The bundle manifest's published schema, and the full check of a bundle before it ships.

``edge/manifest.schema.json`` (JSON Schema 2020-12) is the contract between the package stage
that writes a manifest and every reader on the robot. :func:`check_bundle` goes beyond the
digests that :func:`edge.bundle.verify_bundle` checks: the manifest against the schema, its
target against this registry's row of the compatibility matrix (opset and precision through
:func:`edge.targets.preflight`), its engine tolerances against the bounds per precision, the
image inputs of a policy that sees against their cameras and calibration members, the chunks
of a policy that emits them (``io.chunk``) against its action shape, the ONNX
model's real opset and I/O (every image input's name, element type and size included) against
the manifest, and the Dockerfile against the target.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

from edge.bundle import open_bundle
from edge.engine import tolerance_problem
from edge.errors import BundleError, EdgeError
from edge.runtime import (
    DIFFUSION_KEY,
    MANIFEST_NAME,
    NOISE_NAME,
    SCHEDULE_NAME,
    BundleBytes,
    diffusion_problem,
)
from physai_core.errors import printable

SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")
"""The published JSON Schema of ``manifest.json``."""


@cache
def schema() -> dict[str, Any]:
    """The manifest schema, parsed once."""
    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return data


def validate_manifest(manifest: Mapping[str, Any], where: Path | str) -> None:
    """Refuse a manifest that does not follow the schema, naming the first bad field."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(dict(manifest)),
                    key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        error = errors[0]
        field = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        value = json.dumps(error.instance)[:80]
        raise BundleError(printable(
            f"{where}: member {MANIFEST_NAME!r}: field {field!r}: "
            f"{' '.join(error.message.split())[:160]} (value: {value})"
        ))


def check_bundle(bundle: Path | BundleBytes, trust_key: Path | None = None) -> dict[str, Any]:
    """Everything :func:`edge.bundle.verify_bundle` checks (the signature too, given
    ``trust_key``), then schema, target, engine tolerances, model and Dockerfile; returns the
    manifest. ``bundle`` is a file, read once, or a bundle :func:`edge.bundle.open_bundle`
    already read and checked; nothing is written."""
    from edge.container import NAME as DOCKERFILE
    from edge.container import check_dockerfile
    from edge.targets import get_target, preflight

    contents = bundle if isinstance(bundle, BundleBytes) else open_bundle(Path(bundle),
                                                                           trust_key=trust_key)
    path, manifest = contents.path, contents.manifest
    validate_manifest(manifest, path)

    def refuse(member: str, problem: str) -> BundleError:
        return BundleError(" ".join(f"{path}: member {member!r}: {problem}".split()))

    low, high = manifest["io"]["actions"]["range"]
    if not low <= high:
        raise refuse(MANIFEST_NAME, f"field 'io.actions.range' needs low <= high (value: "
                                    f"{[low, high]})")
    recorded = manifest["target"]
    try:
        target = get_target(recorded["name"])
        preflight(target, manifest["opset"], manifest["precision"])
    except EdgeError as exc:
        raise refuse(MANIFEST_NAME, str(exc)) from None
    if recorded != asdict(target) | {"precisions": list(target.precisions)}:
        changed = sorted(k for k, v in asdict(target).items()
                         if recorded.get(k) != (list(v) if isinstance(v, tuple) else v))
        raise refuse(MANIFEST_NAME, f"field 'target.{changed[0]}' disagrees with the "
                                    f"compatibility matrix for {target.name!r} (value: "
                                    f"{recorded.get(changed[0])!r})")
    problem = tolerance_problem(manifest.get("engine", {}).get("tolerances", {}))
    if problem:
        raise refuse(MANIFEST_NAME, problem)
    problem = images_problem(manifest) or chunk_problem(manifest) or \
        diffusion_manifest_problem(manifest)
    if problem:
        raise refuse(MANIFEST_NAME, problem)
    if "policy.onnx" not in contents.members:
        raise refuse("policy.onnx", "missing from the bundle")
    _check_model(bytes(contents.members["policy.onnx"]), manifest, refuse)
    if DOCKERFILE in contents.members:
        try:
            check_dockerfile(bytes(contents.members[DOCKERFILE]).decode("utf-8", "replace"),
                             target, manifest["files"], where=f"{path}: member {DOCKERFILE!r}")
        except EdgeError as exc:
            raise BundleError(str(exc)) from None
    return manifest


def images_problem(manifest: Mapping[str, Any]) -> str | None:
    """Why a schema-valid manifest's image inputs do not hold together, or None: each
    ``io.images`` entry is named after its camera (``<camera>_image``), once; the calibration
    set lists exactly ``obs`` (its ``member``) and every image input, each a listed member."""
    images = [entry["name"] for entry in manifest["io"].get("images", [])]
    for k, entry in enumerate(manifest["io"].get("images", [])):
        if entry["name"] != f"{entry['camera']}_image":
            return (f"field 'io.images.{k}.name' must be its camera's image "
                    f"'{entry['camera']}_image' (value: {entry['name']!r})")
        if images.count(entry["name"]) > 1:
            return f"field 'io.images.{k}.name' names an image twice (value: {entry['name']!r})"
    calibration = manifest["engine"]["calibration"]
    inputs = calibration.get("inputs", {"obs": calibration["member"]} if not images else {})
    if sorted(inputs) != sorted(["obs", *images]):
        return (f"field 'engine.calibration.inputs' must list obs and every image input "
                f"{images} (value: {sorted(inputs)})")
    if inputs["obs"] != calibration["member"]:
        return (f"field 'engine.calibration.inputs.obs' must be the field 'member' "
                f"{calibration['member']!r} (value: {inputs['obs']!r})")
    for name, member in sorted(inputs.items()):
        if member not in manifest["files"]:
            return (f"field 'engine.calibration.inputs.{name}' names no member of the bundle "
                    f"(value: {member!r})")
    return None


def chunk_problem(manifest: Mapping[str, Any]) -> str | None:
    """Why a schema-valid manifest's ``io.chunk`` and action shape do not hold together, or
    None: a policy that emits chunks of k actions has ``io.actions.shape`` ['batch', k,
    act_dim] and runs at most k of each chunk; any other has ['batch', act_dim]."""
    io = manifest["io"]
    shape = io["actions"]["shape"]
    chunk = io.get("chunk")
    if chunk is None:
        if len(shape) != 2:
            return (f"field 'io.actions.shape' is a chunk of actions ['batch', k, act_dim]; "
                    f"such a policy needs field 'io.chunk' (value: {shape})")
        return None
    if len(shape) != 3 or shape[1] != chunk["size"]:
        return (f"field 'io.actions.shape' must be ['batch', {chunk['size']}, act_dim] for "
                f"chunks of io.chunk.size {chunk['size']} (value: {shape})")
    if chunk.get("execute", 1) > chunk["size"]:
        return (f"field 'io.chunk.execute' must be at most io.chunk.size {chunk['size']} "
                f"(value: {chunk['execute']})")
    return None


def diffusion_manifest_problem(manifest: Mapping[str, Any]) -> str | None:
    """Why a schema-valid manifest's ``io.diffusion`` cannot run, or None
    (:func:`edge.runtime.diffusion_problem`; its chunk is ``n_action_steps`` executed one by
    one)."""
    spec = manifest["io"].get(DIFFUSION_KEY)
    if spec is None:
        return None
    problem = diffusion_problem(spec)
    if problem:
        return f"field 'io.{DIFFUSION_KEY}': {problem}"
    chunk = manifest["io"].get("chunk") or {}
    if chunk.get("size") != spec["n_action_steps"] or "execute" not in chunk:
        return (f"field 'io.chunk' must be {{size: {spec['n_action_steps']}, execute: n}} for "
                f"a diffusion policy (value: {chunk})")
    return None


def _check_model(onnx_bytes: bytes, manifest: Mapping[str, Any], refuse: Any) -> None:
    """The ONNX model's default-domain opset and I/O shapes must be the manifest's."""
    import onnx

    try:
        model = onnx.load_model_from_string(onnx_bytes)
    except Exception as exc:  # protobuf raises its own DecodeError
        raise refuse("policy.onnx", f"not an ONNX model: {exc}") from None
    opsets = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if opsets != [manifest["opset"]]:
        raise refuse("policy.onnx", f"model opset {opsets} differs from the manifest's field "
                                    f"'opset' (value: {manifest['opset']})")
    graph = model.graph
    diffusion = manifest["io"].get(DIFFUSION_KEY)
    frames = [diffusion["n_obs_steps"]] if diffusion is not None else []
    extra = [NOISE_NAME, SCHEDULE_NAME] if diffusion is not None else []
    images = {entry["name"]: [*frames, *entry["shape"][1:]]
              for entry in manifest["io"].get("images", [])}
    names = ([i.name for i in graph.input], [o.name for o in graph.output])
    if (sorted(names[0]), names[1]) != (sorted(["obs", *images, *extra]), ["actions"]):
        wanted = " + ".join(["obs", *images, *extra])
        raise refuse("policy.onnx", f"graph I/O must be {wanted} -> actions (value: {names})")
    inputs = {tensor.name: tensor for tensor in graph.input}
    for name, shape in images.items():
        kind = inputs[name].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in kind.shape.dim]
        if kind.elem_type != onnx.TensorProto.UINT8 or dims[1:] != shape:
            raise refuse("policy.onnx", f"input {name} is "
                                        f"{onnx.TensorProto.DataType.Name(kind.elem_type)} "
                                        f"{dims}, not the manifest's field 'io.images' uint8 "
                                        f"(value: {['batch', *shape]})")
    for tensor, key in ((inputs["obs"], "obs"), (graph.output[0], "actions")):
        dims = tensor.type.tensor_type.shape.dim
        width = dims[-1].dim_value if dims else 0
        if width != manifest["io"][key]["shape"][-1]:
            raise refuse("policy.onnx", f"{key} width {width} differs from the manifest's "
                                        f"field 'io.{key}.shape' (value: "
                                        f"{manifest['io'][key]['shape']})")
    declared = manifest["io"]["actions"]["shape"]
    dims = graph.output[0].type.tensor_type.shape.dim
    if len(dims) != len(declared) or (len(dims) == 3 and dims[1].dim_value != declared[1]):
        found = [d.dim_value or d.dim_param for d in dims]
        raise refuse("policy.onnx", f"actions {found} differ from the manifest's field "
                                    f"'io.actions.shape' (value: {declared})")
