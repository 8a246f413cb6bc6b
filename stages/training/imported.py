"""Policies trained elsewhere: the ``import`` training algorithm (``train: {source: ...}``).

A policy enters without being trained here from

- an ONNX file, as Isaac Lab exports one (``exported/policy.onnx``: input ``obs``, output
  ``actions``, batch 1), or any ONNX graph of float tensors;
- an MLflow model (``models:/NAME/VERSION``, ``models:/NAME@ALIAS``, ``runs:/RUN_ID/PATH``),
  through its ``onnx`` flavor only: a model without one is refused, and no pickled ``pyfunc``
  is ever loaded;
- a TorchScript file, only with ``trust_code: true``: TorchScript is code that runs when it
  is loaded. It is exported to ONNX here, its parity checked against TorchScript;
- a folder LeRobot saved (``pretrained_model/`` of an ACT policy, or a ``lerobot-train`` output
  or checkpoint folder holding one): loaded and exported by LeRobot's own code in the
  ``lerobot`` stage environment, stored as an ONNX chunk policy that reads the task's state
  and camera images (:mod:`stages.policies.lerobot`), its parity checked against LeRobot's
  ``select_action``.

The policy is stored as ONNX ``obs`` (batch, obs_dim) -> ``actions`` (batch, act_dim) in the
task's order (a LeRobot policy: ``obs`` and ``<camera>_image`` -> ``actions`` (batch, k,
act_dim)). When the source already has that form its bytes are stored as given, so the
policy's digest is the source file's sha256; otherwise (other tensor names, another order, a
subset of the observations, several inputs or outputs, TorchScript) the network is wrapped,
unchanged, in a graph that gathers its inputs from ``obs`` and its outputs into ``actions``
(:func:`edge.export.wrap_io`), and the source's sha256 is the policy's parent. Either way the
source's sha256, URI and kind are tags of the stage's MLflow run. Before anything is
published the policy runs on probe observations: a file that is no policy, a width that
differs from the mapping, or a NaN action is a one-line :class:`~physai_core.errors.ConfigError`
naming the config file, the field and the value (exit status 2).

A policy says which units its actions are in (``action_units``, stages/core/units.py). One declared
``native`` acts in its environment's own units (forces in -3..3 N for
``gymnasium:InvertedPendulum-v5``): its outputs are mapped to the task's normalized convention
inside the stored graph (``(a - mid) / half_span``, :func:`normalized_onnx`), so everything
downstream sees the convention every policy here acts in, and parity is checked against the
source's outputs mapped the same way. One declared ``normalized`` must keep every probe action
within -1..1: a probe action beyond is refused in one line (a native policy declared
normalized looks like this). Undeclared, the actions are taken as normalized, unchecked, as
before units were declared.
"""

from __future__ import annotations

import logging
import re
import tempfile
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, PositiveFloat, PositiveInt, field_validator

from physai_core.errors import ConfigError, PhysaiError, Problem
from stages.artifacts.records import Dataset, EdgeBundle, Policy
from stages.core.hashing import sha256_bytes
from stages.core.resources import resolve_file
from stages.core.schema import ConfigModel
from stages.core.units import UNITS_HELP, ActionRange, ActionUnits
from stages.policies.lerobot import export_policy, folder_digest, pretrained_folder, read_folder
from stages.policies.local import PolicyFn, load_actor, onnx_actor

if TYPE_CHECKING:
    import onnx

    from edge.export import GraphPort
    from stages.orchestration.context import StageContext
    from stages.sim.tasks.catalog import TaskSpec
    from stages.storage.store import ArtifactStore
    from stages.tracking.lineage import LineageRecorder, ModelRef
    from stages.training.context import TrainingContext

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
PROBES = 64
"""Random observations (standard normal) the imported policy is run on, besides all zeros."""
RANGE_TOLERANCE = 1e-6
"""How far past -1..1 a probe action of a policy declared normalized may reach (rounding)."""
NATIVE_PREFIX = "native/"
"""Prefix of every name of a native policy's graph inside its normalized wrapper."""
SourceKind = Literal["onnx", "torchscript", "mlflow", "lerobot"]
Entry = int | str
"""A task observation or action entry: its name in the task's spec, or its 0-based index."""

MAPPING_HELP = (
    "a mapping from each tensor name of the policy to the task entries of its columns, in "
    "order: names from the task's spec or 0-based indices"
)

IMPORT = "import"
"""The algorithm of a ``train:`` section that names a ``source`` and no algorithm: a policy
trained elsewhere, brought in as it is."""


class ImportConfig(ConfigModel):
    """Bring a policy trained elsewhere; training is skipped (``train: {source: ...}``).

    ``inputs`` maps each input tensor of the policy to the task observation entries its
    columns receive, in the policy's order (``{obs: [obs[3], obs[1]]}``: a policy of two
    observations, the task's fourth then second). ``outputs`` maps each output tensor to the
    task action entries its columns drive; together the outputs drive every action once.
    Unset: the policy's single input takes every observation in the task's order, and its
    single output (or the one named ``actions``) drives every action in order.
    """

    algorithm: Literal["import"] = Field("import", description="implied by source when "
                                         "no algorithm is given")
    source: str = Field(
        min_length=1,
        description="the policy: an ONNX or TorchScript file or a LeRobot policy folder "
        "(relative to the config file, or pkg:PACKAGE/PATH), or an MLflow model URI "
        "models:/NAME/VERSION, models:/NAME@ALIAS or runs:/RUN_ID/PATH with an onnx flavor",
    )
    sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$",
        description="expected sha256 of the source's ONNX or TorchScript bytes (of a LeRobot "
        "folder: over its files' names and sha256s); a source that differs is refused (pins "
        "what a path or alias names)",
    )
    inputs: dict[str, tuple[Entry, ...]] | None = Field(None, description=MAPPING_HELP)
    outputs: dict[str, tuple[Entry, ...]] | None = Field(None, description=MAPPING_HELP)
    camera_keys: dict[str, str] | None = Field(
        None, description="a LeRobot policy's image feature for each task camera whose name "
        "differs ({front: observation.images.top}); unset: cameras match by name",
    )
    trust_code: bool = Field(
        False, description="admit a TorchScript source, which is code that runs when loaded"
    )
    opset: PositiveInt = Field(17, description="ONNX opset a TorchScript source is exported to")
    parity_tolerance: PositiveFloat = Field(
        1e-5, description="max |stored policy - source runtime| on the probe observations (a "
        "LeRobot policy: against its select_action, step by step)"
    )
    action_units: ActionUnits | None = Field(
        None, description=f"{UNITS_HELP}; native outputs are converted to normalized ones; "
        "unset: taken as normalized, unchecked (docs/policies.md)",
    )

    @field_validator("inputs", "outputs")
    @classmethod
    def _non_empty(
        cls, value: dict[str, tuple[Entry, ...]] | None
    ) -> dict[str, tuple[Entry, ...]] | None:
        if value is not None and (not value or not all(value.values())):
            raise ValueError("map at least one tensor, each to at least one entry")
        return value


@dataclass(frozen=True)
class Where:
    """Where a source is named, for error messages: the file and the field of its reference."""

    file: str | Path
    field: str

    def error(self, value: object, message: str) -> ConfigError:
        """A one-line error about ``value`` at this place."""
        return ConfigError.one(self.file, self.field, value, message)


@dataclass(frozen=True)
class ImportedPolicy:
    """A policy from elsewhere as this project stores it, with what it was made from."""

    onnx: bytes
    """ONNX ``obs`` (batch, obs_dim) -> ``actions`` (batch, act_dim), task order."""
    source_uri: str
    """The source as named (a resolved path, or the MLflow URI)."""
    source_kind: SourceKind
    """Where the network came from."""
    source_digest: str
    """sha256 of the source's network bytes (the file; for MLflow the flavor's ONNX file)."""
    as_given: bool
    """Whether ``onnx`` is the source's bytes unchanged (then its digest is the source's)."""
    parity_max_abs_diff: float
    """Largest |stored policy - source runtime| over the probe observations."""
    probes: int
    """Probe observations the policy ran on."""
    action_units: ActionUnits | None = None
    """The units the import declared for the source's actions (None: undeclared)."""
    converted_from: ActionRange | None = None
    """The native range the source's actions are mapped from in ``onnx``; None: its actions
    are stored as they are."""
    params: Mapping[str, object] = field(default_factory=dict)
    """What the source says of itself beside the above (a LeRobot policy's version, type and
    chunking), logged with the stage's parameters."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Further measurements of the import (a LeRobot policy's chunk parity and latency)."""


def check_source(cfg: ImportConfig, config_file: Path) -> list[Problem]:
    """At config load: a source file must exist (its contents are checked when the stage
    runs, before anything is stored); an MLflow URI is looked up then too."""
    if is_mlflow_uri(cfg.source):
        return []
    try:
        path = resolve_file(cfg.source, config_file.parent)
    except ValueError as exc:
        return [Problem(str(config_file), "train.source", cfg.source, str(exc))]
    if path.is_dir() and pretrained_folder(path) is None:
        return [Problem(str(config_file), "train.source", cfg.source, "a folder without "
                        "config.json and model.safetensors: not a LeRobot policy")]
    if not path.exists():
        return [Problem(str(config_file), "train.source", cfg.source,
                        f"policy file not found: {path}")]
    return []


def cache_inputs(cfg: ImportConfig, config_file: Path) -> dict[str, str]:
    """What the import's result depends on beside its config, for its cache key: the sha256
    of a source file, or the registry version a ``models:/NAME@ALIAS`` points at now (a
    ``models:/NAME/VERSION`` or ``runs:/`` URI names fixed content). A source that cannot be
    read gives its reference alone; the stage then reports the problem when it runs."""
    ref = cfg.source
    if not is_mlflow_uri(ref):
        try:
            path = resolve_file(ref, config_file.parent)
            folder = pretrained_folder(path) if path.is_dir() else None
            if folder is not None:
                return {"sha256": folder_digest(folder)}
            return {"sha256": sha256_bytes(path.read_bytes())}
        except (ValueError, OSError):
            return {"unreadable": ref}
    if ref.startswith("models:/") and "@" in ref:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        from stages.core.settings import resolve_settings

        name, alias = ref.removeprefix("models:/").split("@", 1)
        uri = resolve_settings().tracking_uri
        try:
            version = MlflowClient(uri, registry_uri=uri).get_model_version_by_alias(name, alias)
        except MlflowException:
            return {"unresolved": ref}
        return {"model": f"models:/{name}/{version.version}"}
    return {"uri": ref}


def is_mlflow_uri(ref: str) -> bool:
    """Whether ``ref`` names an MLflow model rather than a file."""
    return ref.startswith(("models:/", "runs:/"))


def source_file(
    ref: str, base: Path, where: Where, tracking_uri: str | None, work: Path
) -> tuple[Path, str]:
    """The local file of the network ``ref`` names, and the URI to record for it.

    A path is resolved against ``base``; an MLflow URI is downloaded into ``work`` and must
    carry an ``onnx`` flavor, whose ONNX file is returned (the ``MLmodel`` file is read as
    YAML data; nothing of the model is imported or unpickled).
    """
    if not is_mlflow_uri(ref):
        try:
            path = resolve_file(ref, base)
        except ValueError as exc:
            raise where.error(ref, str(exc)) from None
        if not path.is_file():
            raise where.error(ref, f"policy file not found: {path}")
        return path, str(path)
    import mlflow.artifacts
    import yaml
    from mlflow.exceptions import MlflowException

    try:
        local = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=ref, dst_path=str(work), tracking_uri=tracking_uri,
            registry_uri=tracking_uri))
    except (MlflowException, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise where.error(ref, f"MLflow cannot fetch it: {first[:200]}") from None
    mlmodel = local / "MLmodel"
    if not mlmodel.is_file():
        raise where.error(ref, "no MLmodel file: not an MLflow model")
    try:
        spec = yaml.safe_load(mlmodel.read_text(encoding="utf-8"))
        flavors = dict(spec.get("flavors") or {})
    except (yaml.YAMLError, UnicodeDecodeError, AttributeError, TypeError, ValueError):
        raise where.error(ref, "its MLmodel file is not a YAML mapping of flavors") from None
    onnx_flavor = flavors.get("onnx")
    if not isinstance(onnx_flavor, dict) or not isinstance(onnx_flavor.get("data"), str):
        raise where.error(ref, f"the model has flavors {sorted(flavors)} and no onnx flavor; "
                          "only ONNX is admitted (a pickled pyfunc would run code on load)")
    data = (local / onnx_flavor["data"]).resolve()
    if not data.is_relative_to(local.resolve()) or not data.is_file():
        raise where.error(ref, f"its onnx flavor names {onnx_flavor['data']!r}, which is not "
                          "a file inside the model")
    return data, ref


def sniff(path: Path, where: Where, value: object) -> Literal["onnx", "torchscript"]:
    """What the file at ``path`` holds, told from its bytes without running any of it."""
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError) as exc:
            raise where.error(value, f"not a policy file: {exc}") from None
        if any("/code/" in n and n.endswith(".py") for n in names):
            return "torchscript"
        if any(n.endswith("data.pkl") for n in names):
            raise where.error(value, "a pickled torch file (torch.save), which runs code when "
                              "loaded; export the policy to ONNX (or TorchScript)")
        raise where.error(value, "not a policy file: a zip archive that is neither TorchScript "
                          "nor ONNX")
    return "onnx"


def read_onnx(path: Path, where: Where, value: object) -> tuple[onnx.ModelProto, bytes]:
    """Parse and check the ONNX file at ``path``; returns the model and its bytes as given
    (a model keeping weights in external files beside it comes back with them inlined)."""
    import onnx
    from google.protobuf.message import DecodeError

    raw = path.read_bytes()
    try:
        model = onnx.load_from_string(raw)
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
            model = onnx.load(str(path), load_external_data=True)
            raw = model.SerializeToString()
        if not model.graph.node or not model.graph.output:
            raise onnx.checker.ValidationError("the graph has no nodes or no outputs")
        onnx.checker.check_model(model)
    except (DecodeError, onnx.checker.ValidationError, ValueError, RuntimeError,
            OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise where.error(value, f"not an ONNX model: {first[:200]}") from None
    return model, raw


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


def _mapping(
    cfg: ImportConfig, model: onnx.ModelProto, spec: TaskSpec, where: Where
) -> tuple[dict[str, list[int]], list[tuple[str, list[int]]]]:
    """The inputs and outputs of ``model`` as task observation and action indices, checked
    against the graph's declared tensors (float, rank 2, widths matching the mapping)."""
    from edge.export import graph_ports

    ins, outs = graph_ports(model)
    field = where.field.rpartition(".")[0]
    at_in = Where(where.file, f"{field}.inputs" if field else "inputs")
    at_out = Where(where.file, f"{field}.outputs" if field else "outputs")
    if cfg.inputs is None:
        if len(ins) != 1:
            raise at_in.error([p.name for p in ins], "the policy has several inputs; map each "
                              "to the task's observation entries")
        inputs = {ins[0].name: list(range(spec.obs_dim))}
    else:
        inputs = {name: resolve_entries(e, spec.obs_names, "observation", at_in)
                  for name, e in cfg.inputs.items()}
    if cfg.outputs is None:
        named = [p for p in outs if p.name == "actions"]
        chosen = named or (list(outs) if len(outs) == 1 else [])
        if not chosen:
            raise at_out.error([p.name for p in outs], "the policy has several outputs and none "
                               "is named 'actions'; map the ones that drive the task's actions")
        outputs = [(chosen[0].name, list(range(spec.act_dim)))]
    else:
        outputs = [(name, resolve_entries(e, spec.action_names, "action", at_out))
                   for name, e in cfg.outputs.items()]
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


def _as_given(
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


def _torchscript_onnx(
    path: Path, cfg: ImportConfig, spec: TaskSpec, where: Where, work: Path,
) -> tuple[onnx.ModelProto, PolicyFn]:
    """Export the TorchScript policy at ``path`` to ONNX ``obs`` -> ``actions`` of its own
    widths, and return it with the TorchScript module as a numpy function (the source
    runtime for the parity check). Runs the file's code: only called with trust_code."""
    import onnx
    import torch

    from edge.errors import EdgeError
    from edge.export import export_onnx
    from stages.policies.local import policy_fn

    if len(cfg.inputs or {0: 0}) != 1 or len(cfg.outputs or {0: 0}) != 1:
        raise where.error(cfg.source, "a TorchScript policy has one input and one output; map "
                          "one tensor each")
    width = len(next(iter(cfg.inputs.values()))) if cfg.inputs else spec.obs_dim
    try:
        with warnings.catch_warnings():
            # torch.jit.load's deprecation notice, and the exporter's note that a scripted
            # method has no Python signature: neither is the user's to act on.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            module = torch.jit.load(str(path), map_location="cpu")
            exported = export_onnx(module, width, work / "torchscript.onnx", opset=cfg.opset)
    except (EdgeError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise where.error(cfg.source, f"the TorchScript policy does not export to ONNX with "
                          f"{width} observations: {first[:200]}") from None
    return onnx.load(str(exported)), policy_fn(module)


def import_policy(
    cfg: ImportConfig, spec: TaskSpec, *, base: Path, where: Where,
    tracking_uri: str | None = None,
) -> ImportedPolicy:
    """Read, check and convert the policy ``cfg.source`` names for task ``spec``.

    Nothing is written but scratch files, removed on return. See the module doc.
    """
    from edge.errors import EdgeError
    from edge.export import wrap_io

    with tempfile.TemporaryDirectory(prefix="physai-import-") as scratch:
        work = Path(scratch)
        if not is_mlflow_uri(cfg.source):
            folder = _folder(cfg.source, base, where)
            if folder is not None:
                return _import_lerobot(cfg, folder, spec, where, work)
        if cfg.camera_keys is not None:
            raise Where(where.file, where.field.replace("source", "camera_keys")).error(
                cfg.camera_keys, "camera keys name a LeRobot policy's image features; "
                f"{cfg.source} is not a LeRobot policy folder")
        path, uri = source_file(cfg.source, base, where, tracking_uri, work)
        kind = sniff(path, where, cfg.source)
        digest = sha256_bytes(path.read_bytes())
        source_runtime: PolicyFn | None = None
        if kind == "torchscript":
            if not cfg.trust_code:
                raise Where(where.file, where.field.replace("source", "trust_code")).error(
                    False, f"{cfg.source} is TorchScript, which is code that runs when it is "
                    "loaded; admit it with trust_code: true (on the command line: --trust-code), "
                    "or export it to ONNX")
            model, source_runtime = _torchscript_onnx(path, cfg, spec, where, work)
            raw = model.SerializeToString()
        else:
            model, raw = read_onnx(path, where, cfg.source)
            digest = sha256_bytes(raw)
        if cfg.sha256 is not None and cfg.sha256 != digest:
            raise Where(where.file, where.field.replace("source", "sha256")).error(
                cfg.sha256, f"{cfg.source} has sha256 {digest}")
        inputs, outputs = _mapping(cfg, model, spec, where)
        native = spec.action_range()
        converted_from = native if cfg.action_units == "native" and not native.is_identity \
            else None
        fits = kind != "torchscript" and _as_given(model, inputs, outputs, spec)
        if not fits:
            try:
                raw = wrap_io(model, inputs, outputs, spec.obs_dim, spec.act_dim, path) \
                    .SerializeToString(deterministic=True)
            except EdgeError as exc:
                raise where.error(cfg.source, str(exc)) from None
        if converted_from is not None:
            raw = normalized_onnx(raw, converted_from)
        as_given = fits and converted_from is None
        final = work / "policy.onnx"
        final.write_bytes(raw)
        obs = probe_observations(spec.obs_dim)
        actions = _probe(final, obs, spec, where, cfg.source)
        if source_runtime is not None:
            (cols,) = inputs.values()
            expected = source_runtime(obs[:, cols])[:, np.argsort(outputs[0][1])]
        else:
            try:
                expected = _source_actions_onnx(model.SerializeToString(), inputs, outputs,
                                                obs, spec.act_dim)
            except Exception as exc:  # ONNX Runtime's errors derive from Exception directly
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else \
                    type(exc).__name__
                raise where.error(cfg.source, "the source graph does not run one observation "
                                  f"at a time: {first[:200]}") from None
        if converted_from is not None:
            expected = converted_from.to_normalized(expected)
        diff = float(np.abs(expected.astype(np.float64) - actions).max())
        if not diff <= cfg.parity_tolerance:
            raise where.error(cfg.source, f"the stored policy differs from its source runtime "
                              f"by {diff:.3g} (parity_tolerance {cfg.parity_tolerance:g})")
        if cfg.action_units == "normalized":
            _check_normalized(actions, Where(where.file, where.field.replace(
                "source", "action_units")), cfg.source)
    return ImportedPolicy(raw, uri, "mlflow" if is_mlflow_uri(cfg.source) else kind, digest,
                          as_given, diff, len(obs), cfg.action_units, converted_from)


def _folder(ref: str, base: Path, where: Where) -> Path | None:
    """The folder ``ref`` names when it is one (a LeRobot policy's), else None."""
    try:
        path = resolve_file(ref, base)
    except ValueError as exc:
        raise where.error(ref, str(exc)) from None
    return path if path.is_dir() else None


def _import_lerobot(
    cfg: ImportConfig, path: Path, spec: TaskSpec, where: Where, work: Path
) -> ImportedPolicy:
    """Bring in the LeRobot policy folder at ``path`` (:mod:`stages.policies.lerobot`): matched
    to the task, exported in the ``lerobot`` environment, its parity with LeRobot's
    ``select_action`` within ``cfg.parity_tolerance``."""
    folder = read_folder(path, spec, where.file, where.field, cfg.camera_keys)
    if cfg.sha256 is not None and cfg.sha256 != folder.digest:
        raise Where(where.file, where.field.replace("source", "sha256")).error(
            cfg.sha256, f"{cfg.source} has sha256 {folder.digest} (over its files)")
    if cfg.inputs is not None or cfg.outputs is not None:
        field = where.field.replace("source", "inputs" if cfg.inputs is not None else "outputs")
        raise Where(where.file, field).error(
            "set", "a LeRobot policy's tensors are matched to the task by its feature names "
            "(observation.state, observation.images.<camera>, action); leave the mapping unset")
    exported = export_policy(folder, spec.obs_dim, spec.act_dim, work=work, file=where.file,
                             field=where.field, opset=cfg.opset)
    diff = max(exported.parity_max_abs_diff, exported.chunk_max_abs_diff)
    if not diff <= cfg.parity_tolerance:
        raise where.error(cfg.source, f"the exported policy differs from LeRobot's "
                          f"select_action by {diff:.3g} (parity_tolerance "
                          f"{cfg.parity_tolerance:g})")
    raw = exported.onnx
    native = spec.action_range()
    converted_from = native if cfg.action_units == "native" and not native.is_identity \
        else None
    if converted_from is not None:
        raw = normalized_onnx(raw, converted_from)
    if cfg.action_units == "normalized":
        with np.load(work / "reference.npz", allow_pickle=False) as data:
            _check_normalized(data["chunks"].reshape(-1, spec.act_dim), Where(
                where.file, where.field.replace("source", "action_units")), cfg.source)
    report = exported.report
    return ImportedPolicy(
        raw, str(folder.path), "lerobot", folder.digest, False, diff, exported.steps,
        cfg.action_units, converted_from,
        params={"lerobot_version": report.get("lerobot"), "lerobot_type": folder.policy_type,
                "lerobot_chunk": folder.chunk_spec, "lerobot_inputs": folder.inputs},
        metrics={"parity_chunk_max_abs_diff": exported.chunk_max_abs_diff,
                 **({"lerobot_latency_ms_p50": float(report["latency_ms_p50"])}
                    if report.get("latency_ms_p50") is not None else {})})


def _check_normalized(actions: np.ndarray, where: Where, source: str) -> None:
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


def _probe(
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


def publish(
    imported: ImportedPolicy, spec: TaskSpec, ctx: StageContext, stage: str, run_id: str,
) -> Policy:
    """Store ``imported`` as a :class:`~stages.artifacts.records.Policy` of ``spec``'s task."""
    path = ctx.scratch / f"policy-{run_id}.onnx"
    path.write_bytes(imported.onnx)
    parents = () if imported.as_given else (imported.source_digest,)
    return ctx.publish(path, Policy, stage, STAGE_VERSION, parents, run_id, task=spec.name,
                       obs_dim=spec.obs_dim, act_dim=spec.act_dim, hidden=(), algorithm=IMPORT)


def train_stage(
    cfg: ImportConfig, ctx: TrainingContext, stage: str, dataset: Dataset | None
) -> Policy:
    """The ``import`` algorithm's entry in :mod:`stages.training.algorithms`: bring ``cfg.source``
    in.

    The policy is checked before the stage's MLflow run opens, so a bad file writes nothing.
    """

    spec = ctx.task
    imported = import_policy(cfg, spec, base=ctx.config_path.parent,
                             where=Where(ctx.config_path, f"{stage}.source"),
                             tracking_uri=ctx.lineage.tracking_uri)
    with ctx.lineage.stage_run(ctx.experiment, stage, ctx.pipeline_run_id, {}) as run:
        run.log_params({"algorithm": IMPORT, "source": imported.source_uri,
                        "source_kind": imported.source_kind, "as_given": imported.as_given,
                        "inputs": cfg.inputs, "outputs": cfg.outputs,
                        "trust_code": cfg.trust_code,
                        "action_units": cfg.action_units or "undeclared",
                        "actions_converted": "none" if imported.converted_from is None
                        else f"native {imported.converted_from.describe()}",
                        **imported.params})
        run.log_metrics({"parity_max_abs_diff": imported.parity_max_abs_diff,
                         **imported.metrics})
        policy = publish(imported, spec, ctx, stage, run.run_id)
        run.set_tags({"physai.policy.digest": policy.digest,
                      "physai.source.digest": imported.source_digest,
                      "physai.source.uri": imported.source_uri,
                      "physai.source.kind": imported.source_kind})
    log.info("imported %s policy %s (sha256 %s)%s%s", imported.source_kind, imported.source_uri,
             imported.source_digest[:12], "" if imported.as_given else ", wrapped to obs/actions",
             "" if imported.converted_from is None else
             f", native actions mapped to -1..1 ({imported.converted_from.describe()})")
    return policy


@dataclass(frozen=True)
class ResolvedPolicy:
    """A policy named on the command line, ready to run."""

    act: PolicyFn
    """obs (N, obs_dim) -> actions (N, act_dim)."""
    digest: str
    """Its digest in the store, or the sha256 of its ONNX as this project runs it."""
    kind: str
    """``store``, ``registry`` (a version registered here), ``bundle``, ``remote``, or the
    imported source's kind."""
    path: Path | None = None
    """The file ``act`` runs (an ``.npz`` MLP or ONNX), which another process may load
    (:func:`stages.policies.local.load_actor`); None for a policy served over the network."""


_DIGEST = re.compile(r"(?:sha256:)?[0-9a-f]{64}")


def check_reference(ref: str) -> None:
    """Refuse, before any service is opened or anything written, a policy reference that is
    neither a URI (``models:/``, ``runs:/``, ``ws://``), a digest, nor a file that exists."""
    if ref.startswith(("ws://", "wss://")) or is_mlflow_uri(ref) or _DIGEST.fullmatch(ref):
        return
    try:
        path = resolve_file(ref, Path.cwd())
    except ValueError as exc:
        raise ConfigError.one(ref, "", ref, str(exc)) from None
    if not path.is_file() and not (path.is_dir() and pretrained_folder(path) is not None):
        raise ConfigError.one(ref, "", ref, "no such policy file or LeRobot policy folder (nor "
                              "a digest, models:/NAME@ALIAS, models:/NAME/VERSION, runs:/ or "
                              "ws:// URI)")


def registered_model(lineage: LineageRecorder, ref: str) -> ModelRef:
    """The model version ``ref`` (``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``) names; an
    unknown model, version or alias is bad input (:class:`~physai_core.errors.ConfigError`)."""
    from mlflow.exceptions import MlflowException

    try:
        return lineage.resolve_model(ref)
    except PhysaiError as exc:
        cause = exc.__cause__
        if isinstance(cause, MlflowException) and cause.error_code in (
                "RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise ConfigError.one(ref, "", ref, f"no such model version in the MLflow "
                                  f"registry at {lineage.shown_uri}") from None
        raise


def is_bundle(path: Path) -> bool:
    """Whether ``path`` is a file holding a tar archive (an edge bundle, once verified)."""
    import tarfile

    return path.is_file() and tarfile.is_tarfile(path)


def open_bundle(
    path: Path, work: Path, *, trust_key: Path | None = None, allow_unsigned: bool = False,
    shown: str | None = None,
) -> tuple[ResolvedPolicy, str]:
    """The policy inside the edge bundle at ``path``, and the bundle's task.

    The bundle is read once, its signature checked against ``trust_key`` (an unsigned or
    foreign-signed one is refused unless ``allow_unsigned``, which warns in one line) and its
    members against the manifest, then extracted into a fresh folder under ``work``
    (:func:`edge.runtime.load_bundle`). A refusal is a one-line
    :class:`~edge.errors.BundleError` (exit status 2), led by ``shown`` when given."""
    import tempfile

    from edge.errors import BundleError
    from edge.runtime import RuntimeRefusal, load_bundle

    folder = Path(tempfile.mkdtemp(prefix="bundle-", dir=work))
    try:
        loaded = load_bundle(path, folder, providers=["CPUExecutionProvider"],
                             trust_key=trust_key, allow_unsigned=allow_unsigned)
        task = str(loaded.manifest["task"])
        digest = str(loaded.manifest["files"]["policy.onnx"]["sha256"])
    except RuntimeRefusal as exc:
        raise BundleError(f"{shown}: {exc}" if shown else str(exc)) from None
    except (KeyError, TypeError) as exc:
        raise ConfigError.one(shown or str(path), "manifest", path.name,
                              f"the manifest names no task or policy.onnx ({exc})") from None
    onnx_file = loaded.workdir / "policy.onnx"
    return ResolvedPolicy(onnx_actor(onnx_file), digest, "bundle", onnx_file), task


def _remote(ref: str, spec: TaskSpec, where: Where, timeout_s: float) -> ResolvedPolicy:
    """A policy server speaking OpenPI's protocol at ``ref`` (stages/policies/remote.py)."""
    from stages.policies.remote import RemotePolicy

    remote = RemotePolicy(ref, spec.obs_dim, spec.act_dim, timeout_s)
    meta = remote.metadata
    for key, want in (("obs_dim", spec.obs_dim), ("act_dim", spec.act_dim)):
        if key in meta and meta[key] != want:
            remote.close()
            raise where.error(meta[key], f"the server's {key} is {meta[key]}, the task "
                              f"{spec.name}'s {want}")
    if "task" in meta and meta["task"] != spec.name:
        remote.close()
        raise where.error(meta["task"], f"the server serves task {meta['task']}, not "
                          f"{spec.name}")
    digest = str(meta.get("policy_digest") or sha256_bytes(ref.encode()))
    return ResolvedPolicy(remote, digest, "remote")


def resolve_policy(
    ref: str, spec: TaskSpec, store: ArtifactStore, lineage: LineageRecorder, *,
    trust_code: bool = False, work: Path, remote_timeout_s: float = 5.0,
    trust_key: Path | None = None, allow_unsigned: bool = False,
    action_units: ActionUnits | None = None,
) -> ResolvedPolicy:
    """Whatever ``ref`` names as a policy of ``spec``'s task: a policy digest in the store, a
    model version registered by this project (its policy in the store), an MLflow model with
    an onnx flavor, an ONNX or TorchScript file (TorchScript only with ``trust_code``), an
    edge bundle (a file, or its digest in the store: admitted as :func:`open_bundle` says,
    with ``trust_key`` and ``allow_unsigned``), or a policy server at ``ws://host:port``
    speaking OpenPI's protocol (each answer waited for at most ``remote_timeout_s``).
    Imported policies are run from ``work``; nothing is published. ``action_units`` declares
    the units of an imported policy's actions (an ONNX or TorchScript file, an MLflow model);
    a policy stored here, a bundle or a server already acts in the task's convention."""
    where = Where(ref, "")
    if ref.startswith(("ws://", "wss://")):
        return _remote(ref, spec, where, remote_timeout_s)
    if not is_mlflow_uri(ref) and not _DIGEST.fullmatch(ref) and is_bundle(Path(ref)):
        resolved, task = open_bundle(Path(ref), work, trust_key=trust_key,
                                     allow_unsigned=allow_unsigned)
        if task != spec.name:
            raise where.error(task, f"a bundle for another task than {spec.name}")
        return resolved
    digest = ref.removeprefix("sha256:")
    kind = "store"
    if ref.startswith("models:/"):
        model = registered_model(lineage, ref)
        digest = model.tags.get("physai.policy.digest", "")
        kind = "registry"
    if re.fullmatch(r"[0-9a-f]{64}", digest) and store.has(digest):
        artifact = store.get(digest)
        if isinstance(artifact, EdgeBundle):
            resolved, task = open_bundle(store.open_payload(artifact), work,
                                         trust_key=trust_key, allow_unsigned=allow_unsigned,
                                         shown=ref)
            if task != spec.name:
                raise where.error(task, f"a bundle for another task than {spec.name}")
            return resolved
        if not isinstance(artifact, Policy):
            raise where.error(digest, f"a {artifact.kind}, not a policy")
        if artifact.task != spec.name:
            raise where.error(artifact.task, f"a policy for another task than {spec.name}")
        payload = store.open_payload(artifact)
        return ResolvedPolicy(load_actor(payload), artifact.digest, kind, payload)
    if kind == "store" and not is_mlflow_uri(ref) and not Path(ref).exists() \
            and _DIGEST.fullmatch(ref):
        raise where.error(ref, f"no such artifact in the store {store.root}")
    cfg = ImportConfig(source=ref, trust_code=trust_code, action_units=action_units)
    imported = import_policy(cfg, spec, base=Path.cwd(), where=Where(ref, "source"),
                             tracking_uri=lineage.tracking_uri)
    path = work / f"{sha256_bytes(imported.onnx)}.onnx"
    path.write_bytes(imported.onnx)
    return ResolvedPolicy(onnx_actor(path), sha256_bytes(imported.onnx), imported.source_kind,
                          path)
