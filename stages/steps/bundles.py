"""Getting a bundle onto a robot, and the project's own signing key.

``flows bundle pull models:/NAME@ALIAS|DIGEST -o FILE``:
The bundle comes from the artifact store (local or S3) by its digest; when the store does not
hold it (a machine with no store at hand, only the MLflow server), from the registered model
version's MLflow model, which carries the bundle byte for byte among its extra files
(:mod:`stages.tracking.mlflow_model`). Either way the bytes are checked against the digest the model
version records, the bundle is verified whole (every member against the manifest, and with a
trust key its signature), all from the bytes read once, and only then is ``FILE`` written,
atomically.

Every bundle is signed: with the key ``PHYSAI_SIGNING_KEY`` names, else with the project's own,
which :func:`project_signing_key` creates once under ``<PHYSAI_HOME>/keys/`` (P-256, mode
0600, its public key beside it). Commands that run a bundle trust that public key by default
(:func:`default_trust_key`).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from physai_core.errors import ArtifactNotFoundError, ConfigError, PhysaiError
from stages.core.settings import Settings

KEY_FOLDER = "keys"
"""Folder under the state folder (``PHYSAI_HOME``) that holds the project's signing key."""
PRIVATE_KEY_NAME = "bundle-signing.key"
"""The project's private signing key (PEM, PKCS#8, P-256), mode 0600."""
PUBLIC_KEY_NAME = "bundle-signing.pub"
"""The project's public key (PEM), beside the private one: what robots are given to trust."""

BUNDLE_TAG = "physai.bundle.digest"
"""Model-version tag naming the version's bundle digest."""

_DIGEST = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


@dataclass(frozen=True)
class Pulled:
    """What was written: the bundle's digest and where it came from."""

    digest: str
    source: str


def _home(settings_or_home: Settings | Path | str | None) -> Path:
    if settings_or_home is None:
        from stages.core.settings import resolve_settings

        return resolve_settings().home
    if isinstance(settings_or_home, Settings):
        return settings_or_home.home
    return Path(settings_or_home)


def project_key_paths(settings_or_home: Settings | Path | str | None = None) -> tuple[Path, Path]:
    """The project-local private and public key files (which may not exist yet)."""
    folder = _home(settings_or_home) / KEY_FOLDER
    return folder / PRIVATE_KEY_NAME, folder / PUBLIC_KEY_NAME


def default_trust_key(settings_or_home: Settings | Path | str | None = None) -> Path | None:
    """The project-local public key when the project has one (its package stage made it),
    else None: what a command that runs a bundle trusts when given no ``--trust``.

    ``settings_or_home`` is the :class:`Settings` or the state folder (default: resolved from
    the environment, ``PHYSAI_HOME``)."""
    public = project_key_paths(settings_or_home)[1]
    return public if public.is_file() else None


def project_signing_key(settings_or_home: Settings | Path | str | None = None) -> Path:
    """The project-local private signing key, created on first use (P-256, mode 0600, in a
    0700 folder) with its public key beside it; the paths are printed once, when created.

    The key never leaves this file: only its path is passed on, to the signer. A key file
    others can read is refused."""
    private, public = project_key_paths(settings_or_home)
    created = False
    if not private.is_file():
        created = _create_key(private)
    mode = private.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError.one(private, "mode", oct(mode), "the project's signing key must be "
                              "readable by its owner only: chmod 600 it")
    if not public.is_file():
        _write_public_key(private, public)
    if created:
        print(f"created this project's bundle signing key {private} (keep it private) and its "
              f"public key {public} (give it to every robot: --trust)", file=sys.stderr)
    return private


def _crypto() -> tuple[ModuleType, ModuleType]:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as exc:
        raise PhysaiError("signing bundles needs model-signing and cryptography, dependencies "
                          f"of physai-flows: make setup, or pip install physai-flows ({exc})"
                          ) from None
    return serialization, ec


def _create_key(private: Path) -> bool:
    """Create the private key file unless another process just did; True when this one did."""
    serialization, ec = _crypto()
    private.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM,
                            serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd, name = tempfile.mkstemp(dir=private.parent, prefix=".key-")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(name, private)  # atomic, and never over a key that exists
        except FileExistsError:
            return False
    finally:
        os.unlink(name)
    return True


def _write_public_key(private: Path, public: Path) -> None:
    from edge.files import write_bytes_atomic

    serialization, _ = _crypto()
    key = serialization.load_pem_private_key(private.read_bytes(), None)
    write_bytes_atomic(public, key.public_key().public_bytes(
        serialization.Encoding.PEM,
        serialization.PublicFormat.SubjectPublicKeyInfo))


def pull_bundle(ref: str, out: Path, *, trust_key: Path | None = None) -> Pulled:
    """Write the bundle ``ref`` names (``models:/...`` or a bundle digest) to ``out``, read
    once: its digest, every member and, with ``trust_key``, its signature are checked on the
    bytes that are then written."""
    from edge.bundle import open_bundle
    from edge.files import write_bytes_atomic
    from stages.orchestration.context import open_services

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
        bundle = open_bundle(path, trust_key=trust_key)
        if bundle.sha256 != digest:
            raise PhysaiError(f"{ref}: bundle from {source} has sha256 {bundle.sha256}, not the "
                              f"recorded {digest}")
        write_bytes_atomic(out, bundle.data)
    return Pulled(digest, source)


def _from_mlflow(ref: str, model_source: str, scratch: Path) -> Path:
    """Download the model version's MLflow model and return its ``bundle.tar``."""
    import mlflow

    from stages.tracking.mlflow_model import BUNDLE_FILE

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
