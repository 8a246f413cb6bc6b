"""Getting a bundle onto a robot: ``flows bundle pull models:/NAME@ALIAS|DIGEST -o FILE``.

The bundle comes from the artifact store (local or S3) by its digest; when the store does not
hold it (a machine with no store at hand, only the MLflow server), from the registered model
version's MLflow model, which carries the bundle byte for byte among its extra files
(:mod:`stages.mlflow_model`). Either way the bytes are checked against the digest the model
version records, the bundle is verified whole (every member against the manifest, and with a
trust key its signature), and only then is ``FILE`` written, atomically.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stages.errors import ArtifactNotFoundError, ConfigError, PhysaiError

BUNDLE_TAG = "physai.bundle.digest"
"""Model-version tag naming the version's bundle digest."""

_DIGEST = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


@dataclass(frozen=True)
class Pulled:
    """What was written: the bundle's digest and where it came from."""

    digest: str
    source: str


def pull_bundle(ref: str, out: Path, *, trust_key: Path | None = None) -> Pulled:
    """Write the bundle ``ref`` names (``models:/...`` or a bundle digest) to ``out``."""
    from edge.bundle import verify_bundle
    from edge.files import atomic_output
    from stages.context import open_services
    from stages.hashing import sha256_file

    if out.exists() and not out.is_file():
        raise ConfigError.one(ref, "-o", str(out), "is not a file path")
    if not out.parent.is_dir():
        raise ConfigError.one(ref, "-o", str(out), "its folder does not exist")
    settings, store, lineage = open_services()
    model_source: str | None = None
    if ref.startswith("models:/"):
        version = lineage.resolve_model(ref)
        digest = version.tags.get(BUNDLE_TAG, "")
        if not _DIGEST.fullmatch(digest):
            raise ConfigError.one(ref, BUNDLE_TAG, digest or None,
                                  "the model version records no bundle digest")
        model_source = version.source
    elif match := _DIGEST.fullmatch(ref):
        digest = match.group(1)
    else:
        raise ConfigError.one("flows bundle pull", "FILE", ref,
                              "expected models:/NAME@ALIAS, models:/NAME/VERSION or a digest")
    with tempfile.TemporaryDirectory(prefix="physai-pull-") as scratch:
        try:
            path = store.open_payload(store.get(digest))
            source = f"the store ({settings.store_uri})"
        except ArtifactNotFoundError:
            if model_source is None:
                raise
            path = _from_mlflow(ref, model_source, Path(scratch))
            source = f"MLflow ({model_source})"
        got = sha256_file(path)
        if got != digest:
            raise PhysaiError(f"{ref}: bundle from {source} has sha256 {got}, not the "
                              f"recorded {digest}")
        verify_bundle(path, trust_key=trust_key)
        with atomic_output(out) as tmp:
            shutil.copyfile(path, tmp)
    return Pulled(digest, source)


def _from_mlflow(ref: str, model_source: str, scratch: Path) -> Path:
    """Download the model version's MLflow model and return its ``bundle.tar``."""
    import mlflow

    from stages.mlflow_model import BUNDLE_FILE

    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_source,
                                                         dst_path=str(scratch)))
    except Exception as exc:  # MLflow's errors derive from Exception directly
        raise PhysaiError(f"{ref}: the bundle is not in the store and MLflow cannot give the "
                          f"model {model_source}: {type(exc).__name__}") from exc
    found = sorted(local.rglob(BUNDLE_FILE))
    if not found:
        raise PhysaiError(f"{ref}: the MLflow model {model_source} carries no {BUNDLE_FILE}")
    return found[0]
