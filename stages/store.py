"""The content-addressed artifact store: a local folder or an S3 bucket, one interface.

Layout under the root (a folder or ``s3://bucket/prefix``)::

    objects/<aa>/<sha256>      payload bytes, immutable
    artifacts/<sha256>.json    the artifact's typed manifest, written last

Publishing is atomic: the payload is written first (temp file + rename locally, a single PUT or
completed multipart upload on S3), the manifest last, so a reader never sees an artifact whose
payload is missing. Readers verify the payload's sha256 before handing out a path.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from pydantic import ValidationError

from stages.artifacts import ARTIFACT_ADAPTER, ArtifactBase
from stages.errors import ArtifactNotFoundError, IntegrityError, TransientError
from stages.hashing import sha256_file

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

A = TypeVar("A", bound=ArtifactBase)
MakeArtifact = Callable[[str, str], A]
"""Builds the artifact from its payload digest and URI."""


class ArtifactStore(Protocol):
    """What every store backend offers."""

    root: str

    def publish(self, payload: Path, make: Callable[[str, str], A]) -> A:
        """Store ``payload`` and the artifact that ``make(digest, uri)`` returns; atomic."""
        ...

    def get(self, digest: str) -> ArtifactBase:
        """The artifact whose payload has ``digest``; raises ArtifactNotFoundError if absent."""
        ...

    def has(self, digest: str) -> bool:
        """True when the artifact's manifest exists."""
        ...

    def open_payload(self, artifact: ArtifactBase) -> Path:
        """A local path to the artifact's payload, verified against its digest."""
        ...

    def set_ref(self, name: str, digest: str) -> None:
        """Point the named reference ``name`` at artifact ``digest``, atomically."""
        ...

    def get_ref(self, name: str) -> str | None:
        """The digest the reference ``name`` points at, or None when it is not set."""
        ...


def _object_key(digest: str) -> str:
    return f"objects/{digest[:2]}/{digest}"


def _manifest_key(digest: str) -> str:
    return f"artifacts/{digest}.json"


def _ref_key(name: str) -> str:
    if not _REF_NAME.fullmatch(name):
        raise ValueError(f"bad reference name {name!r}: use letters, digits, '.', '_', '-', '/'")
    return f"refs/{name}"


def _parse_manifest(data: bytes, where: str) -> ArtifactBase:
    try:
        artifact: ArtifactBase = ARTIFACT_ADAPTER.validate_json(data)
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"]
        raise IntegrityError(f"{where}: unreadable artifact manifest: {msg}") from None
    return artifact


def _check_digest(path: Path, digest: str, where: str) -> None:
    actual = sha256_file(path)
    if actual != digest:
        raise IntegrityError(f"{where}: payload digest {actual} does not match recorded {digest}")


_REF_NAME = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_DIGEST = re.compile(r"[0-9a-f]{64}")


def _parse_ref(data: bytes, where: str) -> str:
    digest = data.decode(errors="replace").strip()
    if not _DIGEST.fullmatch(digest):
        raise IntegrityError(f"{where}: not a digest: {digest[:80]!r}")
    return digest


class LocalStore:
    """Artifact store in a local folder."""

    def __init__(self, root: str | Path) -> None:
        self.path = Path(root).absolute()
        self.root = str(self.path)

    def _write_atomic(self, key: str, write: Callable[[Path], object]) -> Path:
        final = self.path / key
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".tmp-")
        os.close(fd)
        try:
            write(Path(tmp))
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return final

    def publish(self, payload: Path, make: Callable[[str, str], A]) -> A:
        """Copy ``payload`` into the store and write its manifest last."""
        digest = sha256_file(payload)
        key = _object_key(digest)
        if not (self.path / key).exists():
            self._write_atomic(key, lambda tmp: shutil.copyfile(payload, tmp))
        artifact = make(digest, (self.path / key).as_uri())
        text = artifact.model_dump_json(indent=2).encode()
        self._write_atomic(_manifest_key(digest), lambda tmp: tmp.write_bytes(text))
        return artifact

    def has(self, digest: str) -> bool:
        """True when the manifest of ``digest`` exists."""
        return (self.path / _manifest_key(digest)).is_file()

    def get(self, digest: str) -> ArtifactBase:
        """Read the manifest of ``digest``."""
        path = self.path / _manifest_key(digest)
        if not path.is_file():
            raise ArtifactNotFoundError(f"no artifact {digest} in store {self.root}")
        return _parse_manifest(path.read_bytes(), str(path))

    def open_payload(self, artifact: ArtifactBase) -> Path:
        """Path of the payload inside the store, after verifying its digest."""
        path = self.path / _object_key(artifact.digest)
        if not path.is_file():
            raise ArtifactNotFoundError(f"payload of {artifact.digest} missing from {self.root}")
        _check_digest(path, artifact.digest, str(path))
        return path

    def set_ref(self, name: str, digest: str) -> None:
        """Point reference ``name`` at ``digest`` (write to a temporary file, then rename)."""
        self._write_atomic(_ref_key(name), lambda tmp: tmp.write_text(digest + "\n"))

    def get_ref(self, name: str) -> str | None:
        """The digest reference ``name`` points at, or None."""
        path = self.path / _ref_key(name)
        return _parse_ref(path.read_bytes(), str(path)) if path.is_file() else None


class S3Store:
    """Artifact store under ``s3://bucket/prefix`` through boto3 (any S3-compatible endpoint).

    Payloads are downloaded to ``cache_dir`` and verified there before use.
    """

    def __init__(self, root: str, cache_dir: Path, endpoint_url: str | None = None) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        bucket, _, prefix = root.removeprefix("s3://").partition("/")
        self.root = root
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.cache_dir = cache_dir
        self.client: S3Client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            config=Config(retries={"max_attempts": 6, "mode": "standard"}),
        )
        self.transfer = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NotFound"):
                return False
            raise TransientError(f"{self.root}: S3 error {code} on {key}") from exc
        return True

    def publish(self, payload: Path, make: Callable[[str, str], A]) -> A:
        """Upload ``payload`` (multipart when large), then the manifest."""
        digest = sha256_file(payload)
        key = _object_key(digest)
        if not self._exists(key):
            self.client.upload_file(str(payload), self.bucket, self._key(key), Config=self.transfer)
        artifact = make(digest, f"s3://{self.bucket}/{self._key(key)}")
        body = artifact.model_dump_json(indent=2).encode()
        self.client.put_object(Bucket=self.bucket, Key=self._key(_manifest_key(digest)), Body=body)
        return artifact

    def has(self, digest: str) -> bool:
        """True when the manifest of ``digest`` exists."""
        return self._exists(_manifest_key(digest))

    def get(self, digest: str) -> ArtifactBase:
        """Read the manifest of ``digest``."""
        from botocore.exceptions import ClientError

        key = self._key(_manifest_key(digest))
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as exc:
            raise ArtifactNotFoundError(f"no artifact {digest} in store {self.root}") from exc
        return _parse_manifest(body, f"s3://{self.bucket}/{key}")

    def open_payload(self, artifact: ArtifactBase) -> Path:
        """Download the payload into the local cache (once) and verify it."""
        local = self.cache_dir / _object_key(artifact.digest)
        if local.is_file():
            _check_digest(local, artifact.digest, str(local))
            return local
        local.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=".tmp-")
        os.close(fd)
        try:
            key = self._key(_object_key(artifact.digest))
            self.client.download_file(self.bucket, key, tmp, Config=self.transfer)
            _check_digest(Path(tmp), artifact.digest, f"s3://{self.bucket}/{key}")
            os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return local

    def set_ref(self, name: str, digest: str) -> None:
        """Point reference ``name`` at ``digest`` (one PUT: S3 objects appear whole)."""
        key = self._key(_ref_key(name))
        self.client.put_object(Bucket=self.bucket, Key=key, Body=(digest + "\n").encode())

    def get_ref(self, name: str) -> str | None:
        """The digest reference ``name`` points at, or None."""
        from botocore.exceptions import ClientError

        key = self._key(_ref_key(name))
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NotFound"):
                return None
            raise TransientError(f"{self.root}: S3 error {code} on {key}") from exc
        return _parse_ref(body, f"s3://{self.bucket}/{key}")


def open_store(uri: str, cache_dir: Path, endpoint_url: str | None = None) -> ArtifactStore:
    """The store for ``uri``: ``s3://bucket/prefix`` or a local folder."""
    if uri.startswith("s3://"):
        return S3Store(uri, cache_dir=cache_dir, endpoint_url=endpoint_url)
    return LocalStore(uri)
