"""A policy named on the command line (``flows validate``, ``flows policy serve``), ready to run.

A reference is a policy digest in the store, a model version registered by this project, an
MLflow model with an onnx flavor, Python code (``python:PACKAGE.MODULE:CALLABLE`` with
``--trust-code``, :mod:`stages.policies.python_code`), an ONNX or TorchScript file or a LeRobot
policy folder (imported as the ``import`` algorithm imports it,
:func:`stages.training.imported.import_policy`, nothing published), an edge bundle (a file, or
its digest in the store: its signature and members checked first), or a policy server at
``ws://host:port`` speaking OpenPI's protocol (:class:`stages.policies.remote.RemotePolicy`).
:func:`check_reference` refuses one that can be none of these before any service is opened.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from physai_core.errors import ConfigError, PhysaiError
from stages.artifacts.records import EdgeBundle, Policy
from stages.core.code_refs import is_python_ref, ref_problem
from stages.core.hashing import sha256_bytes
from stages.core.resources import resolve_file
from stages.core.units import ActionUnits
from stages.policies.lerobot import pretrained_folder
from stages.policies.local import PolicyFn, load_actor, onnx_actor
from stages.policies.python_code import PythonPolicy, untrusted
from stages.training.import_sources import Where, is_mlflow_uri
from stages.training.imported import ImportConfig, import_policy

if TYPE_CHECKING:
    from stages.sim.tasks.catalog import TaskSpec
    from stages.storage.store import ArtifactStore
    from stages.tracking.lineage import LineageRecorder, ModelRef


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
    code: str | None = None
    """The Python code it is (``python:PACKAGE.MODULE:CALLABLE``), which another process
    imports itself (a benchmark's stage environment, where its package is installed)."""

    @property
    def crosses(self) -> str | None:
        """What another process loads it from: its file or its Python reference (None: it is
        served over the network)."""
        return self.code or (str(self.path) if self.path is not None else None)


_DIGEST = re.compile(r"(?:sha256:)?[0-9a-f]{64}")


def check_reference(ref: str) -> None:
    """Refuse, before any service is opened or anything written, a policy reference that is
    neither a URI (``models:/``, ``runs:/``, ``ws://``), a digest, nor a file that exists."""
    if ref.startswith(("ws://", "wss://")) or is_mlflow_uri(ref) or _DIGEST.fullmatch(ref):
        return
    if is_python_ref(ref):
        problem = ref_problem(ref)
        if problem is not None:
            raise ConfigError.one(ref, "", ref, problem)
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
    a policy stored here, a bundle or a server already acts in the task's convention.

    Steps: 1. a server; 2. a bundle file; 3. a registered model version's digest; 4. a digest
    in the store (a bundle or a policy); 5. anything else imported, as the ``import``
    algorithm imports it."""
    # -- 1. a policy server, answering over OpenPI's protocol; Python code
    where = Where(ref, "")
    if ref.startswith(("ws://", "wss://")):
        return _remote(ref, spec, where, remote_timeout_s)
    if is_python_ref(ref):
        if not trust_code:
            raise untrusted(ref, "", ref, "--trust-code")
        act = PythonPolicy(ref, spec.action_range(), ref, "")
        return ResolvedPolicy(act, sha256_bytes(ref.encode()), "python", code=ref)
    # -- 2. a bundle file, admitted by its signature
    if not is_mlflow_uri(ref) and not _DIGEST.fullmatch(ref) and is_bundle(Path(ref)):
        resolved, task = open_bundle(Path(ref), work, trust_key=trust_key,
                                     allow_unsigned=allow_unsigned)
        if task != spec.name:
            raise where.error(task, f"a bundle for another task than {spec.name}")
        return resolved
    # -- 3. a model version registered here names its policy's digest
    digest = ref.removeprefix("sha256:")
    kind = "store"
    if ref.startswith("models:/"):
        model = registered_model(lineage, ref)
        digest = model.tags.get("physai.policy.digest", "")
        kind = "registry"
    # -- 4. a digest in the store: a bundle or a policy of this task
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
    # -- 5. a file, a LeRobot folder or an MLflow model: imported, run from work
    cfg = ImportConfig(source=ref, trust_code=trust_code, action_units=action_units)
    imported = import_policy(cfg, spec, base=Path.cwd(), where=Where(ref, "source"),
                             tracking_uri=lineage.tracking_uri)
    path = work / f"{sha256_bytes(imported.onnx)}.onnx"
    path.write_bytes(imported.onnx)
    return ResolvedPolicy(onnx_actor(path), sha256_bytes(imported.onnx), imported.source_kind,
                          path)
