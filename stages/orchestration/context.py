"""What every stage receives besides its config: store, lineage, device, seed and progress."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from stages.artifacts.records import ArtifactBase, Producer
from stages.core.settings import Settings, resolve_settings
from stages.storage.store import ArtifactStore, open_store
from stages.tracking.lineage import LineageRecorder

if TYPE_CHECKING:
    from stages.pipeline.config import ResolvedPipeline

A = TypeVar("A", bound=ArtifactBase)


class ProgressBar(Protocol):
    """One bar of work with a known total."""

    def advance(self, n: int = 1, **fields: object) -> None:
        """Mark ``n`` more units done; ``fields`` are shown beside the bar (loss, rate...)."""
        ...


class Progress(Protocol):
    """Where stages report progress on long work."""

    def bar(self, description: str, total: int) -> AbstractContextManager[ProgressBar]:
        """A context manager yielding a bar for ``total`` units of work."""
        ...


class _NullBar:
    def advance(self, n: int = 1, **fields: object) -> None:
        """Do nothing."""


class NullProgress:
    """Progress that shows nothing (tests, workers without a terminal)."""

    @contextmanager
    def bar(self, description: str, total: int) -> Iterator[ProgressBar]:
        """Yield a bar that ignores updates."""
        yield _NullBar()


_progress: list[Progress] = [NullProgress()]


def current_progress() -> Progress:
    """The progress reporter installed with :func:`use_progress`, or a silent one."""
    return _progress[-1]


@contextmanager
def use_progress(progress: Progress) -> Iterator[None]:
    """Install ``progress`` for stages run inside the block."""
    _progress.append(progress)
    try:
        yield
    finally:
        _progress.pop()


CODE_REVISION_VARIABLE = "PHYSAI_CODE_REVISION"
"""Set in the project's container images to the revision they were built from: an image holds
the project's files, not its git history."""


def code_revision(root: Path | None = None) -> str:
    """The git commit of the working tree at ``root`` (this checkout when None; ``+dirty`` when
    modified); in a container image, the one it was built from (:data:`CODE_REVISION_VARIABLE`);
    else the package version."""
    pinned = os.environ.get(CODE_REVISION_VARIABLE) if root is None else None
    return pinned or _git_revision(root or Path(__file__).resolve().parents[2])


@functools.cache
def _git_revision(root: Path) -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"physai-flows=={version('physai-flows')}"
        except PackageNotFoundError:
            return "unknown"
    return f"{rev}+dirty" if dirty else rev


def resolve_device(requested: str) -> str:
    """``auto`` becomes ``cuda`` when a GPU is visible, else ``cpu``."""
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class StageContext:
    """Shared services of one pipeline run."""

    pipeline: ResolvedPipeline
    settings: Settings
    store: ArtifactStore
    lineage: LineageRecorder
    pipeline_run_id: str
    progress: Progress = field(default_factory=NullProgress)

    @property
    def experiment(self) -> str:
        """The MLflow experiment of this pipeline."""
        return self.pipeline.config.name

    @property
    def seed(self) -> int:
        """The pipeline's base seed."""
        return self.pipeline.config.seed

    @property
    def scratch(self) -> Path:
        """A local folder for files on their way into the store, this process's own: two runs
        on one state folder never share (or clean up) each other's files."""
        path = self.settings.home / "tmp" / str(os.getpid())
        path.mkdir(parents=True, exist_ok=True)
        return path

    def producer(self, stage: str, version: str) -> Producer:
        """The producer record for an artifact made by ``stage`` in this run."""
        return Producer(
            stage=stage,
            stage_version=version,
            config_digest=self.pipeline.stage_digest(stage),
            code_revision=code_revision(),
        )

    def publish(self, payload: Path, kind: type[A], stage: str, version: str,
                parents: tuple[str, ...], run_id: str | None, /, **fields: Any) -> A:
        """Move ``payload`` into the store as a ``kind`` artifact made by ``stage``.

        Args:
            payload: The artifact's file (a local one, e.g. under :attr:`scratch`); removed once
                stored.
            kind: The artifact's class.
            stage: The stage that made it (its producer record's ``stage``).
            version: That stage's version string.
            parents: Digests of the artifacts it was made from.
            run_id: The MLflow run that made it, or None.
            **fields: The fields of ``kind`` beyond those of every artifact.

        Returns:
            The stored artifact, its digest and URI the store's.
        """
        artifact = self.store.publish(payload, lambda digest, uri: kind(
            digest=digest, uri=uri, producer=self.producer(stage, version), parents=parents,
            mlflow_run_id=run_id, **fields))
        payload.unlink()
        return artifact


def open_services(
    settings: Settings | None = None,
) -> tuple[Settings, ArtifactStore, LineageRecorder]:
    """Build the store and lineage recorder from settings (the environment by default)."""
    settings = settings or resolve_settings()
    store = open_store(settings.store_uri, settings.home / "cache", settings.s3_endpoint_url)
    artifact_root = settings.mlflow_artifacts if settings.embedded_mlflow else None
    return settings, store, LineageRecorder(settings.tracking_uri, artifact_root)


def start_pipeline(pipeline: ResolvedPipeline, settings: Settings | None = None) -> str:
    """Open the parent MLflow run of one pipeline run; returns its id."""
    settings, _, lineage = open_services(settings)
    cfg = pipeline.config
    run = lineage.start_run(
        cfg.name,
        f"{cfg.name}-pipeline",
        tags={"physai.config_digest": pipeline.config_digest,
              "physai.config_path": str(pipeline.path),
              "physai.code_revision": code_revision()},
    )
    run.log_params({"task": cfg.task, "seed": cfg.seed, "config_path": pipeline.path})
    run.log_dict(cfg.model_dump(mode="json", by_alias=True), "resolved_config.json")
    return run.run_id


def stage_context(
    pipeline: ResolvedPipeline, run_id: str, progress: Progress, settings: Settings | None = None
) -> StageContext:
    """The context stages of run ``run_id`` share."""
    settings, store, lineage = open_services(settings)
    return StageContext(pipeline, settings, store, lineage, run_id, progress)
