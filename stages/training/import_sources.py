"""Where an imported policy's network comes from, told apart by its bytes without running it.

A source is a path (resolved against the config file's folder, or ``pkg:PACKAGE/PATH``) or an
MLflow model URI (``models:/NAME/VERSION``, ``models:/NAME@ALIAS``, ``runs:/RUN_ID/PATH``),
admitted through its ``onnx`` flavor only (:func:`source_file`). A file is ONNX, or TorchScript
(:func:`sniff`: a ``torch.save`` pickle is refused unread); ONNX is parsed and checked
(:func:`read_onnx`), TorchScript, which is code, exported to ONNX only where the import trusts
it (:func:`torchscript_onnx`). A folder is a LeRobot policy's (:func:`source_folder`). Every
refusal is one line naming the config file and field (:class:`Where`).
"""

from __future__ import annotations

import warnings
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from physai_core.errors import ConfigError
from stages.core.resources import resolve_file
from stages.policies.local import PolicyFn

if TYPE_CHECKING:
    import onnx

    from stages.sim.tasks.catalog import TaskSpec

SourceKind = Literal["onnx", "torchscript", "mlflow", "lerobot"]


@dataclass(frozen=True)
class Where:
    """Where a source is named, for error messages: the file and the field of its reference."""

    file: str | Path
    field: str

    def error(self, value: object, message: str) -> ConfigError:
        """A one-line error about ``value`` at this place."""
        return ConfigError.one(self.file, self.field, value, message)

    def beside(self, name: str) -> Where:
        """The field ``name`` of the same section (``train.source`` -> ``train.NAME``)."""
        section = self.field.rpartition(".")[0]
        return Where(self.file, f"{section}.{name}" if section else name)


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


def torchscript_onnx(
    path: Path, source: str, inputs: Mapping[str, Sequence[object] | str] | None,
    outputs: Mapping[str, Sequence[object]] | None, opset: int, spec: TaskSpec, where: Where,
    work: Path,
) -> tuple[onnx.ModelProto, PolicyFn]:
    """Export the TorchScript policy at ``path`` to ONNX ``obs`` -> ``actions`` of its own
    widths, and return it with the TorchScript module as a numpy function (the source
    runtime for the parity check); ``inputs`` and ``outputs`` are the import's tensor mapping,
    ``source`` the reference it was named by. Runs the file's code: only called with
    trust_code."""
    import onnx
    import torch

    from edge.errors import EdgeError
    from edge.export import export_onnx
    from stages.policies.local import policy_fn

    if len(inputs or {0: 0}) != 1 or len(outputs or {0: 0}) != 1:
        raise where.error(source, "a TorchScript policy has one input and one output; map "
                          "one tensor each")
    read = next(iter(inputs.values())) if inputs else "obs"
    if isinstance(read, str) and read != "obs":
        raise where.error(read, "a TorchScript policy reads the state alone: map its input to "
                          "obs or a list of state entries")
    width = spec.obs_dim if isinstance(read, str) else len(read)
    try:
        with warnings.catch_warnings():
            # torch.jit.load's deprecation notice, and the exporter's note that a scripted
            # method has no Python signature: neither is the user's to act on.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            module = torch.jit.load(str(path), map_location="cpu")
            exported = export_onnx(module, width, work / "torchscript.onnx", opset=opset)
    except (EdgeError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise where.error(source, f"the TorchScript policy does not export to ONNX with "
                          f"{width} observations: {first[:200]}") from None
    return onnx.load(str(exported)), policy_fn(module)


def source_folder(ref: str, base: Path, where: Where) -> Path | None:
    """The folder ``ref`` names when it is one (a LeRobot policy's), else None."""
    try:
        path = resolve_file(ref, base)
    except ValueError as exc:
        raise where.error(ref, str(exc)) from None
    return path if path.is_dir() else None
