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
(:func:`edge.export.wrap_io`), and the source's sha256 is the policy's parent. A graph that
sees (an input mapped to a camera's ``<camera>_image``) is wrapped likewise, each image input
fed the camera's uint8 HWC frame transposed, cast and scaled as the graph wants it
(:mod:`stages.training.import_images`), so it is stored as a vision policy of this project.
Either way the source's sha256, URI and kind are tags of the stage's MLflow run. Before
anything is published the policy runs on probe observations (and, one that sees, probe camera
frames): a file that is no policy, a width that differs from the mapping, an image that does
not fit the task's camera, or a NaN action is a one-line
:class:`~physai_core.errors.ConfigError` naming the config file, the field and the value (exit
status 2).

A policy says which units its actions are in (``action_units``, stages/core/units.py). One
declared ``native`` acts in its environment's own units (forces in -3..3 N for
``gymnasium:InvertedPendulum-v5``): its outputs are mapped to the task's normalized convention
inside the stored graph (``(a - mid) / half_span``,
:func:`~stages.training.import_checks.normalized_onnx`), so everything downstream sees the
convention every policy here acts in, and parity is checked against the source's outputs mapped
the same way. One declared ``normalized`` must keep every probe action within -1..1: a probe
action beyond is refused in one line (a native policy declared normalized looks like this).
Undeclared, the actions are taken as normalized, unchecked, as before units were declared.

Where a network comes from is :mod:`stages.training.import_sources`; what it must pass and the
forms it is stored in, :mod:`stages.training.import_checks`; a policy named on the command line
rather than in a config, :mod:`stages.training.policy_reference`.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, PositiveFloat, PositiveInt, field_validator

from physai_core.errors import Problem
from stages.artifacts.records import Dataset, Policy
from stages.core.hashing import sha256_bytes
from stages.core.resources import resolve_file
from stages.core.schema import ConfigModel
from stages.core.units import UNITS_HELP, ActionRange, ActionUnits
from stages.policies.lerobot import export_policy, folder_digest, pretrained_folder, read_folder
from stages.policies.local import PolicyFn
from stages.training.import_checks import (
    Entry,
    check_normalized,
    in_task_form,
    normalized_onnx,
    probe_actions,
    probe_observations,
    source_parity,
    stored_form,
    tensor_mapping,
)
from stages.training.import_images import ImageLayout, ImageRange, probe_frames
from stages.training.import_sources import (
    SourceKind,
    Where,
    is_mlflow_uri,
    read_onnx,
    sniff,
    source_file,
    source_folder,
    torchscript_onnx,
)

if TYPE_CHECKING:
    from stages.orchestration.context import StageContext
    from stages.sim.tasks.catalog import TaskSpec
    from stages.training.context import TrainingContext

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
MAPPING_HELP = (
    "a mapping from each tensor name of the policy to the task entries of its columns, in "
    "order: names from the task's spec or 0-based indices"
)

INPUTS_HELP = (
    "a mapping from each input tensor of the policy to the task's observation tensor it reads "
    "(obs, or a camera's <camera>_image) or to the task entries of its columns, in order: "
    "names from the task's spec or 0-based indices; inputs named obs or <camera>_image map "
    "themselves"
)

IMPORT = "import"
"""The algorithm of a ``train:`` section that names a ``source`` and no algorithm: a policy
trained elsewhere, brought in as it is."""

class ImportConfig(ConfigModel):
    """Bring a policy trained elsewhere; training is skipped (``train: {source: ...}``).

    ``inputs`` maps each input tensor of the policy to the task observation entries its
    columns receive, in the policy's order (``{obs: [obs[3], obs[1]]}``: a policy of two
    observations, the task's fourth then second), or to a tensor of the task's observation by
    name: ``obs``, the whole state in order, or a camera's ``<camera>_image`` (``{state: obs,
    rgb: front_image}``); inputs named as the task's tensors map themselves. An image input's
    layout and pixel range are read from the graph (``image_layout``, ``image_range`` state
    them where it cannot say). ``outputs`` maps each output tensor to the
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
    inputs: dict[str, tuple[Entry, ...] | str] | None = Field(None, description=INPUTS_HELP)
    outputs: dict[str, tuple[Entry, ...]] | None = Field(None, description=MAPPING_HELP)
    image_layout: dict[str, ImageLayout] | None = Field(
        None, description="where each image input of the policy has its channels, by input "
        "name: hwc (batch, H, W, 3) or chw (batch, 3, H, W); unset: read from its shape",
    )
    image_range: dict[str, ImageRange] | None = Field(
        None, description="the pixel values each float image input of the policy takes, by "
        "input name: 0..1 or 0..255; unset: 0..1 (a uint8 input takes 0..255)",
    )
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
        cls, value: dict[str, tuple[Entry, ...] | str] | None
    ) -> dict[str, tuple[Entry, ...] | str] | None:
        if value is not None and (not value or not all(value.values())):
            raise ValueError("map at least one tensor, each to at least one entry")
        return value


@dataclass(frozen=True)
class ImportedPolicy:
    """A policy from elsewhere as this project stores it, with what it was made from."""

    onnx: bytes
    """ONNX ``obs`` (batch, obs_dim) (and, for a policy that sees, each ``<camera>_image``
    uint8 (batch, H, W, 3)) -> ``actions`` (batch, act_dim), task order."""
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


def import_policy(
    cfg: ImportConfig, spec: TaskSpec, *, base: Path, where: Where,
    tracking_uri: str | None = None,
) -> ImportedPolicy:
    """Read, check and convert the policy ``cfg.source`` names for task ``spec``.

    Nothing is written but scratch files, removed on return. See the module doc. Steps:
    1. a LeRobot policy folder goes its own way (:func:`import_lerobot`); 2. the network's
    file found and told apart by its bytes; 3. loaded as ONNX (TorchScript exported first, only
    with ``trust_code``), its sha256 pinned; 4. its tensors mapped to the task's entries, the
    graph wrapped to ``obs`` -> ``actions`` unless it already is, native actions normalized;
    5. the stored policy probed and held to its source runtime; 6. a policy declared
    normalized kept within -1..1.
    """
    with tempfile.TemporaryDirectory(prefix="physai-import-") as scratch:
        work = Path(scratch)
        # -- 1. a LeRobot folder is loaded and exported by LeRobot's own code
        if not is_mlflow_uri(cfg.source):
            folder = source_folder(cfg.source, base, where)
            if folder is not None:
                return import_lerobot(cfg, folder, spec, where, work)
        if cfg.camera_keys is not None:
            raise Where(where.file, where.field.replace("source", "camera_keys")).error(
                cfg.camera_keys, "camera keys name a LeRobot policy's image features; "
                f"{cfg.source} is not a LeRobot policy folder")
        # -- 2. a path or an MLflow model's onnx flavor, its kind read from its bytes
        path, uri = source_file(cfg.source, base, where, tracking_uri, work)
        kind = sniff(path, where, cfg.source)
        digest = sha256_bytes(path.read_bytes())
        source_runtime: PolicyFn | None = None
        # -- 3. ONNX, checked; TorchScript runs code when loaded, so it needs trust_code
        if kind == "torchscript":
            if not cfg.trust_code:
                raise Where(where.file, where.field.replace("source", "trust_code")).error(
                    False, f"{cfg.source} is TorchScript, which is code that runs when it is "
                    "loaded; admit it with trust_code: true (on the command line: --trust-code), "
                    "or export it to ONNX")
            model, source_runtime = torchscript_onnx(path, cfg.source, cfg.inputs, cfg.outputs,
                                                     cfg.opset, spec, where, work)
            raw = model.SerializeToString()
        else:
            model, raw = read_onnx(path, where, cfg.source)
            digest = sha256_bytes(raw)
        if cfg.sha256 is not None and cfg.sha256 != digest:
            raise Where(where.file, where.field.replace("source", "sha256")).error(
                cfg.sha256, f"{cfg.source} has sha256 {digest}")
        # -- 4. the stored form: obs -> actions in the task's order, in normalized units
        mapping = tensor_mapping(cfg.inputs, cfg.outputs, model, spec, where,
                                 layouts=cfg.image_layout, ranges=cfg.image_range)
        native = spec.action_range()
        converted_from = native if cfg.action_units == "native" and not native.is_identity \
            else None
        fits = kind != "torchscript" and in_task_form(model, mapping, spec)
        if not fits:
            raw = stored_form(model, mapping, spec, path, where, cfg.source)
        if converted_from is not None:
            raw = normalized_onnx(raw, converted_from)
        as_given = fits and converted_from is None
        # -- 5. the stored policy runs on the probes and matches its source runtime
        final = work / "policy.onnx"
        final.write_bytes(raw)
        obs = probe_observations(spec.obs_dim)
        frames = probe_frames(mapping.images, len(obs))
        actions = probe_actions(final, obs, spec, where, cfg.source, frames)
        diff = source_parity(model, source_runtime, mapping, obs, actions,
                             converted_from=converted_from, tolerance=cfg.parity_tolerance,
                             where=where, source=cfg.source, frames=frames)
        # -- 6. a policy declared normalized must act within -1..1
        if cfg.action_units == "normalized":
            check_normalized(actions, Where(where.file, where.field.replace(
                "source", "action_units")), cfg.source)
    return ImportedPolicy(raw, uri, "mlflow" if is_mlflow_uri(cfg.source) else kind, digest,
                          as_given, diff, len(obs), cfg.action_units, converted_from)


def import_lerobot(
    cfg: ImportConfig, path: Path, spec: TaskSpec, where: Where, work: Path
) -> ImportedPolicy:
    """Bring in the LeRobot policy folder at ``path`` (:mod:`stages.policies.lerobot`): matched
    to the task, exported in the ``lerobot`` environment, its parity with LeRobot's
    ``select_action`` within ``cfg.parity_tolerance``."""
    folder = read_folder(path, spec, where.file, where.field, cfg.camera_keys)
    if cfg.sha256 is not None and cfg.sha256 != folder.digest:
        raise Where(where.file, where.field.replace("source", "sha256")).error(
            cfg.sha256, f"{cfg.source} has sha256 {folder.digest} (over its files)")
    given = [name for name in ("inputs", "outputs", "image_layout", "image_range")
             if getattr(cfg, name) is not None]
    if given:
        field = where.field.replace("source", given[0])
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
    raw = with_chunking(raw, folder.chunk_spec)
    if cfg.action_units == "normalized":
        with np.load(work / "reference.npz", allow_pickle=False) as data:
            check_normalized(data["chunks"].reshape(-1, spec.act_dim), Where(
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


def with_chunking(raw: bytes, spec: Mapping[str, Any]) -> bytes:
    """``raw`` (ONNX) stamped with how LeRobot runs its chunks (``spec`` without its size,
    :data:`~stages.policies.local.CHUNK_METADATA`), which validation and packaging then follow:
    the parity was checked in that mode."""
    import onnx

    from stages.policies.local import CHUNK_METADATA

    model = onnx.load_from_string(raw)
    kept = [p for p in model.metadata_props if p.key != CHUNK_METADATA]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    how = {k: v for k, v in spec.items() if k != "size"}
    model.metadata_props.add(key=CHUNK_METADATA, value=json.dumps(how))
    return model.SerializeToString()


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
                        "image_layout": cfg.image_layout, "image_range": cfg.image_range,
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
