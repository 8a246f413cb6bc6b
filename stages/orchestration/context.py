"""What every stage receives besides its config: store, lineage, seed, progress, and which
pipeline run and config file it works for.

The context knows no pipeline: a step is given its section, the task and its scenes as
arguments by the pipeline layer (:mod:`stages.pipeline.run`), which also builds the context
(:func:`stages.pipeline.session.stage_context`)."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from stages.artifacts.records import ArtifactBase, Producer
from stages.core.settings import Settings, resolve_settings
from stages.storage.store import ArtifactStore, open_store
from stages.tracking.lineage import LineageRecorder

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
    """Shared services of one pipeline run, and what names it."""

    experiment: str
    """The MLflow experiment of the pipeline: its name."""
    seed: int
    """The pipeline's base seed."""
    config_path: Path
    """The pipeline's config file: messages name it, and a stage environment reads it again."""
    config_digests: Mapping[str, str]
    """Digest of what decides each stage's output, by stage name (producer records)."""
    settings: Settings
    store: ArtifactStore
    lineage: LineageRecorder
    pipeline_run_id: str
    progress: Progress = field(default_factory=NullProgress)

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
            config_digest=self.config_digests[stage],
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
