"""The registered policy as an MLflow model: the bundle's ONNX network in MLflow's ONNX flavor.

A promoted bundle becomes an MLflow 3 LoggedModel that MLflow's own tools load and serve
(``mlflow.pyfunc.load_model``, ``mlflow.onnx.load_model``, ``mlflow models serve``):

- ``model.onnx``: the bundle's ``policy.onnx`` graph, input ``obs`` float32
  ``(batch, obs_dim)`` (and, for a policy that sees, one ``<camera>_image`` uint8
  ``(batch, H, W, 3)`` per camera), one output ``actions`` float32 ``(batch, act_dim)``;
- ``MLmodel``: the ``onnx`` and ``python_function`` flavors, a tensor signature naming ``obs``,
  every image input and ``actions`` with the shapes of the bundle's manifest, and an input
  example (the first rows of the bundle's calibration set: real observations, and for a policy
  that sees a mapping of every input to its rows of the same samples);
- ``extra_files/bundle.tar`` (the bundle byte for byte, so ``flows bundle verify`` and the
  robot runtime take it as packaged) and ``extra_files/manifest.json`` (readable in the UI).

The pyfunc takes the observation array of a state policy as it is, and a mapping of named
inputs (``{"obs": ..., "front_image": ...}``) for a policy that sees.

The model version's description is the gate table in markdown; the logged model carries the
per-scene success rates and their 95% Wilson intervals as metrics (``<scene>/success_rate``,
``<scene>/ci_low``, ``<scene>/ci_high``, the keys the validate run uses).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from physai_core.errors import ConfigError

if TYPE_CHECKING:
    from mlflow.models.signature import ModelSignature

    from stages.artifacts.records import EdgeBundle, GateResult, SimReport

log = logging.getLogger(__name__)

DESCRIPTION_LIMIT = 5000
"""Longest model-version description MLflow's SQL stores keep (characters)."""
EXAMPLE_ROWS = 2
"""Observations in the input example."""
BUNDLE_FILE = "bundle.tar"
"""Name of the bundle among the logged model's extra files."""
_METRIC_KEY = re.compile(r"[^\w\-. /]")


@dataclass(frozen=True)
class PolicyModel:
    """What the registry records of one bundle besides its lineage tags."""

    onnx_path: Path
    """The bundle's ONNX network (inputs ``obs`` and the images, output ``actions``)."""
    extra_files: tuple[Path, ...]
    """Files logged beside the network: the bundle tar and its manifest."""
    obs_name: str
    obs_dim: int
    act_name: str
    act_dim: int
    input_example: np.ndarray | Mapping[str, np.ndarray]
    """Observations, float32, shape (rows, obs_dim); for a policy that sees, every input by
    name: ``obs`` as before and each image uint8 (rows, H, W, 3), row i of each one sample."""
    metadata: Mapping[str, str]
    """Written into the ``MLmodel`` file: task, target, bundle digest."""
    description: str
    """The model version's description: the gate table in markdown."""
    metrics: Mapping[str, float]
    """Metrics of the logged model: per-scene success rates and interval bounds."""
    images: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    """Image inputs in the graph's order: name (``<camera>_image``) to frame shape (H, W, 3),
    uint8; empty for a state policy."""
    chunk_size: int = 1
    """Actions per query: above 1, the output is a chunk, (batch, chunk_size, act_dim)."""


def policy_model(
    unpacked: Path, bundle_tar: Path, report: SimReport, bundle: EdgeBundle
) -> PolicyModel:
    """The model of the bundle unpacked in ``unpacked`` (its tar at ``bundle_tar``, which must
    be named :data:`BUNDLE_FILE`), validated in ``report``."""
    manifest_path = unpacked / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    obs, act = _io(manifest, manifest_path)
    images = _images(manifest, manifest_path)
    return PolicyModel(
        onnx_path=unpacked / "policy.onnx",
        extra_files=(bundle_tar, manifest_path),
        obs_name=obs[0],
        obs_dim=obs[1],
        act_name=act[0],
        act_dim=act[1],
        input_example=input_example(unpacked, manifest, obs[1], images),
        metadata={"physai.task": str(manifest.get("task", "")),
                  "physai.target": bundle.target,
                  "physai.bundle.digest": bundle.digest,
                  "physai.sim_report.digest": report.digest},
        description=gate_table(report, bundle),
        metrics=scene_metrics(report),
        images=images,
        chunk_size=_chunk_size(manifest),
    )


def _chunk_size(manifest: Mapping[str, Any]) -> int:
    """The chunk of actions one query gives (the manifest's ``io.chunk.size``; 1 without)."""
    chunk = manifest["io"].get("chunk") or {}
    return int(chunk.get("size", 1)) if isinstance(chunk, Mapping) else 1


def _io(manifest: Mapping[str, Any], path: Path) -> tuple[tuple[str, int], tuple[str, int]]:
    """(name, width) of the observation input and the action output the manifest declares."""
    found = []
    for key in ("obs", "actions"):
        try:
            entry = manifest["io"][key]
            found.append((str(entry["name"]), int(entry["shape"][-1])))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ConfigError.one(path, f"io.{key}", manifest.get("io"),
                                  f"no name and shape [batch, width] ({exc})") from exc
    return found[0], found[1]


def _images(manifest: Mapping[str, Any], path: Path) -> dict[str, tuple[int, int, int]]:
    """Name to frame shape (H, W, 3) of every ``io.images`` entry, in the manifest's order."""
    out: dict[str, tuple[int, int, int]] = {}
    for k, entry in enumerate(manifest["io"].get("images") or []):
        try:
            height, width, channels = (int(d) for d in entry["shape"][1:])
            out[str(entry["name"])] = (height, width, channels)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError.one(path, f"io.images.{k}", entry,
                                  f"no name and shape [batch, H, W, 3] ({exc})") from exc
    return out


def input_example(
    unpacked: Path,
    manifest: Mapping[str, Any],
    obs_dim: int,
    images: Mapping[str, tuple[int, int, int]] | None = None,
) -> np.ndarray | dict[str, np.ndarray]:
    """The first :data:`EXAMPLE_ROWS` observations of the bundle's calibration set, or zeros
    when the bundle has none; float32, shape (rows, obs_dim).

    For a policy with ``images`` (name to frame shape (H, W, 3)), a mapping of ``obs`` and every
    image input to the same first rows of its calibration member (``engine.calibration.inputs``),
    each image uint8 (rows, H, W, 3); one row of zeros of every input when a member is missing
    or of another shape."""
    calibration = (manifest.get("engine") or {}).get("calibration", {})
    if not images:
        rows = _calibration_rows(unpacked, calibration.get("member"), (obs_dim,))
        return (rows if rows is not None else np.zeros((1, obs_dim))).astype(np.float32)
    shapes: dict[str, tuple[int, ...]] = {"obs": (obs_dim,), **images}
    dtypes = {name: np.float32 if name == "obs" else np.uint8 for name in shapes}
    members = calibration.get("inputs") or {}
    found: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        rows = _calibration_rows(unpacked, members.get(name), shape)
        if rows is not None:
            found[name] = rows.astype(dtypes[name])
    if len(found) < len(shapes) or len({len(rows) for rows in found.values()}) != 1:
        return {name: np.zeros((1, *shape), dtypes[name]) for name, shape in shapes.items()}
    return found


def _calibration_rows(unpacked: Path, member: object, shape: tuple[int, ...]
                      ) -> np.ndarray | None:
    """The first :data:`EXAMPLE_ROWS` samples of calibration ``member`` (shape (rows, *shape)),
    or None when there is no such member, no sample or samples of another shape."""
    if not isinstance(member, str) or not (unpacked / member).is_file():
        return None
    rows = np.load(unpacked / member, allow_pickle=False)[:EXAMPLE_ROWS]
    if rows.shape[1:] != shape or not len(rows):
        return None
    return np.ascontiguousarray(rows)


def signature(model: PolicyModel) -> ModelSignature:
    """The tensor signature: ``obs`` float32 (-1, obs_dim) and each image input uint8
    (-1, H, W, 3) in, ``actions`` (-1, act_dim) out, or (-1, k, act_dim) for a policy that
    emits chunks of k."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    f32 = np.dtype(np.float32)
    chunk = (model.chunk_size,) if model.chunk_size > 1 else ()
    images = [TensorSpec(np.dtype(np.uint8), (-1, *shape), name)
              for name, shape in model.images.items()]
    return ModelSignature(
        inputs=Schema([TensorSpec(f32, (-1, model.obs_dim), model.obs_name), *images]),
        outputs=Schema([TensorSpec(f32, (-1, *chunk, model.act_dim), model.act_name)]),
    )


def log_onnx_model(model: PolicyModel, model_id: str, run_id: str, tracking_uri: str) -> None:
    """Write the ONNX flavor of ``model`` into the LoggedModel ``model_id`` (created by the
    caller, linked to ``run_id``) at ``tracking_uri`` and mark it READY.

    ``mlflow.onnx.log_model`` talks to the process's global tracking URI, which is set here.
    The pip requirements are the flavor's defaults, so MLflow does not start a subprocess to
    infer them; the ONNX graph is saved as one file (no external tensor data)."""
    import mlflow.onnx
    import onnx

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.onnx.log_model(
        onnx.load(str(model.onnx_path)),
        name=model_id,
        model_id=model_id,
        run_id=run_id,
        signature=signature(model),
        input_example=(dict(model.input_example) if isinstance(model.input_example, Mapping)
                       else model.input_example),
        pip_requirements=mlflow.onnx.get_default_pip_requirements(),
        save_as_external_data=False,
        extra_files=[str(p) for p in model.extra_files],
        metadata=dict(model.metadata),
    )


def scene_metrics(report: SimReport) -> dict[str, float]:
    """Per-scene success rate and 95% Wilson interval bounds, keyed ``<scene>/<stat>``."""
    out: dict[str, float] = {}
    for scene in report.scenes:
        key = _METRIC_KEY.sub("_", scene.scene)
        out |= {f"{key}/success_rate": scene.success_rate, f"{key}/ci_low": scene.ci_low,
                f"{key}/ci_high": scene.ci_high}
    return out


def gate_table(report: SimReport, bundle: EdgeBundle, limit: int = DESCRIPTION_LIMIT) -> str:
    """Markdown: the verdict, the table of every gate, then the per-scene table; rows that do
    not fit in ``limit`` characters are dropped (failed gates first kept), with a count."""
    passed = report.passed and bundle.passed
    head = [
        f"**Gates {'passed' if passed else 'failed'}** - suite `{report.suite}` "
        f"(digest `{report.suite_digest[:12]}`), {report.backend} {report.backend_version}, "
        f"target `{bundle.target}`",
        "",
        "| gate | measured | threshold | result |",
        "|---|---|---|---|",
    ]
    gates = sorted((*report.gates, *bundle.gates), key=lambda g: g.passed)
    gate_rows = [_gate_row(g) for g in gates]
    scene_rows = [
        "",
        "| scene | episodes | successes | success rate [95% CI] |",
        "|---|---|---|---|",
        *(f"| {_cell(s.scene)} | {s.episodes} | {s.successes} | "
          f"{s.success_rate:.3f} [{s.ci_low:.3f}, {s.ci_high:.3f}] |" for s in report.scenes),
    ]
    text = "\n".join([*head, *gate_rows, *scene_rows])
    if len(text) <= limit:
        return text
    kept: list[str] = []
    for row in gate_rows:
        note = f"\n\n{len(gate_rows) - len(kept)} more gates in the sim report {report.digest[:12]}"
        if len("\n".join([*head, *kept, row])) + len(note) > limit:
            return ("\n".join([*head, *kept]) + note)[:limit]
        kept.append(row)
    note = "\n\nPer-scene success rates: the logged model's metrics."
    return ("\n".join([*head, *kept]) + note)[:limit]


def _gate_row(gate: GateResult) -> str:
    result = "pass" if gate.passed else "**FAIL**"
    detail = f" ({_cell(gate.detail)})" if gate.detail else ""
    return f"| {_cell(gate.name)}{detail} | {gate.measured:.4g} | {gate.threshold:.4g} | {result} |"


def _cell(text: str) -> str:
    """``text`` safe inside a markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")
