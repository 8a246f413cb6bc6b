"""The content-addressed artifact store: a local folder or an S3 bucket, one interface.

Layout under the root (a folder or ``s3://bucket/prefix``)::

    objects/<aa>/<sha256>      payload bytes, immutable
    artifacts/<sha256>.json    the artifact's typed manifest, written last

Publishing is atomic: the payload is written first (temp file + rename locally, a single PUT or
completed multipart upload on S3), the manifest last, so a reader never sees an artifact whose
payload is missing. Locally each file, and then its folder, is synced before the next is
written, so the order holds across a power cut too. Readers verify the payload's sha256 before
handing out a path.

On S3, transient faults (5xx, throttling, dropped connections) are retried with backoff and end
in :class:`~physai_core.errors.TransientError`; refusals (access denied, no such bucket) fail at
once with :class:`StoreAccessError`, naming the object.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from pydantic import ValidationError

from physai_core.errors import ArtifactNotFoundError, IntegrityError, PhysaiError, TransientError
from stages.artifacts.records import ARTIFACT_ADAPTER, ArtifactBase
from stages.core.crash import crash_point
from stages.core.hashing import sha256_file

if TYPE_CHECKING:
    from botocore.exceptions import ClientError
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import HeadObjectOutputTypeDef

log = logging.getLogger(__name__)
A = TypeVar("A", bound=ArtifactBase)
R = TypeVar("R")
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
    return f"objects/{_checked_digest(digest)[:2]}/{digest}"


def _manifest_key(digest: str) -> str:
    return f"artifacts/{_checked_digest(digest)}.json"


def _checked_digest(digest: str) -> str:
    """``digest`` if it is 64 lowercase hex digits; anything else names no artifact (and
    must never become a path: digests come from tags, parameters and manifests)."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ArtifactNotFoundError(f"not an artifact digest: {str(digest)[:80]!r}")
    return digest


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


def _fsync_folder(folder: Path) -> None:
    """Put ``folder``'s entries on disk: a rename into it, or a folder made in it, survives a
    power cut only once its folder is synced. Filesystems that cannot sync a folder are let
    be."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _make_folder(folder: Path) -> None:
    """Make ``folder`` and its missing parents, each synced into the folder above it."""
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        made.mkdir(exist_ok=True)
        _fsync_folder(made.parent)


class LocalStore:
    """Artifact store in a local folder."""

    def __init__(self, root: str | Path) -> None:
        self.path = Path(root).absolute()
        self.root = str(self.path)

    def _write_atomic(self, key: str, write: Callable[[Path], object]) -> Path:
        """Write ``key`` through a temporary file renamed into place; the file, the rename and
        any folder made for it are on disk when this returns."""
        final = self.path / key
        tmp = ""
        try:
            _make_folder(final.parent)
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".tmp-")
            os.close(fd)
            write(Path(tmp))
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            crash_point(f"store.write.temp_written.{key.split('/')[0]}.{final.name[:16]}")
            os.replace(tmp, final)
            _fsync_folder(final.parent)
        except OSError as exc:
            raise StoreAccessError(f"{final}: cannot write to the store: "
                                   f"{exc.strerror or exc}") from exc
        finally:
            if tmp and os.path.exists(tmp):
                os.unlink(tmp)
        return final

    def publish(self, payload: Path, make: Callable[[str, str], A]) -> A:
        """Copy ``payload`` into the store and write its manifest last."""
        digest = sha256_file(payload)
        key = _object_key(digest)
        artifact = make(digest, (self.path / key).as_uri())
        if not (self.path / key).exists():
            self._write_atomic(key, lambda tmp: shutil.copyfile(payload, tmp))
        crash_point(f"store.publish.payload_written.{artifact.kind}.{digest[:12]}")
        text = artifact.model_dump_json(indent=2).encode()
        self._write_atomic(_manifest_key(digest), lambda tmp: tmp.write_bytes(text))
        crash_point(f"store.publish.published.{artifact.kind}.{digest[:12]}")
        return artifact

    def has(self, digest: str) -> bool:
        """True when the manifest of ``digest`` exists."""
        return bool(_DIGEST.fullmatch(digest)) and (self.path / _manifest_key(digest)).is_file()

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


_TRANSIENT_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling",
    "ThrottlingException", "RequestTimeTooSkewed", "NoSuchUpload",
})
"""S3 error codes worth retrying. ``NoSuchUpload`` answers the retry of a multipart completion
whose first answer was lost; the whole upload is then checked and, if needed, redone."""

_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})

_NETWORK_ERRORS = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, TimeoutError)


class StoreAccessError(PhysaiError):
    """A store write or read refused for good: S3 access denied, no such bucket, bad
    credentials; a local disk full or read-only. Not retried."""


def _missing(exc: ClientError) -> bool:
    """True when S3 answered that the object does not exist."""
    return exc.response.get("Error", {}).get("Code", "") in _MISSING_CODES


def _s3_fault(exc: BaseException) -> tuple[bool, str] | None:
    """``(transient, reason)`` when ``exc`` (or what it wraps) is an S3 or network fault.

    None for anything else: local I/O errors and bugs are not retried.
    """
    from boto3.exceptions import RetriesExceededError
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        HTTPClientError,
        IncompleteReadError,
        NoCredentialsError,
        PartialCredentialsError,
    )
    from s3transfer.exceptions import RetriesExceededError as TransferRetriesExceededError
    from urllib3.exceptions import HTTPError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ClientError):
            error = current.response.get("Error", {})
            status = current.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            code = error.get("Code") or str(status)
            message = error.get("Message") or "no message"
            reason = f"HTTP {code} {message}" if code.isdigit() else f"{code}: {message}"
            return (status >= 500 or status in (408, 429) or code in _TRANSIENT_CODES, reason)
        if isinstance(current, NoCredentialsError | PartialCredentialsError):
            return False, f"{current}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        if isinstance(current, RetriesExceededError | TransferRetriesExceededError):
            current = getattr(current, "last_exception", None)
            continue
        if isinstance(current, (ConnectionError, HTTPClientError, IncompleteReadError, HTTPError,
                                *_NETWORK_ERRORS)):
            return True, f"{type(current).__name__}: {current}"
        current = current.__cause__ or current.__context__
    return None


class S3Store:
    """Artifact store under ``s3://bucket/prefix`` through boto3 (any S3-compatible endpoint).

    Every request is retried by botocore (standard mode); a whole operation that still fails on
    a transient fault (5xx, throttling, a dropped connection, a broken download) is retried up
    to ``attempts`` times with exponential backoff and jitter from ``backoff_s``, then raises
    :class:`TransientError`. Permanent refusals raise :class:`StoreAccessError` at once.
    A payload counts as stored only when ``head_object`` shows its size and the sha256 recorded
    in its metadata; its manifest is written after that. Payloads of ``part_size`` bytes or more
    travel as multipart transfers. Payloads are downloaded to ``cache_dir`` and verified there
    before use.
    """

    def __init__(self, root: str, cache_dir: Path, endpoint_url: str | None = None, *,
                 attempts: int = 4, backoff_s: float = 0.5, part_size: int = 8 << 20) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        bucket, _, prefix = root.removeprefix("s3://").partition("/")
        self.root = root
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.cache_dir = cache_dir
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.client: S3Client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            config=Config(retries={"max_attempts": 6, "mode": "standard"},
                          connect_timeout=10, read_timeout=60),
        )
        self.transfer = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def _retry(self, what: str, key: str, op: Callable[[], R]) -> R:
        """Run ``op``; retry transient faults with backoff, fail at once on permanent ones."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return op()
            except Exception as exc:
                fault = _s3_fault(exc)
                if fault is None:
                    raise
                transient, reason = fault
                if not transient:
                    raise StoreAccessError(f"{self._url(key)}: {what} refused: {reason}") from exc
                if attempt == self.attempts:
                    raise TransientError(f"{self._url(key)}: {what} gave up after {attempt} "
                                         f"attempts; last: {reason}") from exc
                delay = min(self.backoff_s * 2 ** (attempt - 1), 30.0) * random.uniform(0.5, 1)
                log.warning("%s: %s failed (%s); retry %d/%d in %.1f s", self._url(key), what,
                            reason, attempt, self.attempts - 1, delay)
                time.sleep(delay)

    def _head(self, key: str) -> HeadObjectOutputTypeDef | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if _missing(exc):
                return None
            raise

    def _read(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist (retried)."""
        from botocore.exceptions import ClientError

        def read() -> bytes | None:
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as exc:
                if _missing(exc):
                    return None
                raise
            return response["Body"].read()

        return self._retry("read", key, read)

    def _put(self, key: str, body: bytes) -> None:
        """Write a small object in one PUT (retried: S3 objects appear whole)."""
        self._retry("write", key, lambda: self.client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=body))

    def _payload_stored(self, key: str, size: int, digest: str) -> bool:
        head = self._head(key)
        return (head is not None and head.get("ContentLength") == size
                and head.get("Metadata", {}).get("sha256") == digest)

    def _upload(self, payload: Path, key: str, digest: str) -> None:
        """Upload ``payload`` unless S3 already holds it whole; confirm it with a HEAD after."""
        size = payload.stat().st_size

        def upload() -> None:
            if self._payload_stored(key, size, digest):
                return
            self.client.upload_file(str(payload), self.bucket, self._key(key),
                                    ExtraArgs={"Metadata": {"sha256": digest}},
                                    Config=self.transfer)
            if not self._payload_stored(key, size, digest):
                raise IntegrityError(f"{self._url(key)}: after upload S3 does not hold the "
                                     f"{size} bytes of sha256 {digest}")

        self._retry("upload", key, upload)

    def publish(self, payload: Path, make: Callable[[str, str], A]) -> A:
        """Upload ``payload`` (multipart when large) and confirm it, then write the manifest."""
        digest = sha256_file(payload)
        key = _object_key(digest)
        artifact = make(digest, self._url(key))
        self._upload(payload, key, digest)
        crash_point(f"store.publish.payload_written.{artifact.kind}.{digest[:12]}")
        self._put(_manifest_key(digest), artifact.model_dump_json(indent=2).encode())
        crash_point(f"store.publish.published.{artifact.kind}.{digest[:12]}")
        return artifact

    def has(self, digest: str) -> bool:
        """True when the manifest of ``digest`` exists."""
        if not _DIGEST.fullmatch(digest):
            return False
        key = _manifest_key(digest)
        return self._retry("check", key, lambda: self._head(key)) is not None

    def get(self, digest: str) -> ArtifactBase:
        """Read the manifest of ``digest``."""
        key = _manifest_key(digest)
        body = self._read(key)
        if body is None:
            raise ArtifactNotFoundError(f"no artifact {digest} in store {self.root}")
        return _parse_manifest(body, self._url(key))

    def open_payload(self, artifact: ArtifactBase) -> Path:
        """Download the payload into the local cache (once) and verify it."""
        local = self.cache_dir / _object_key(artifact.digest)
        if local.is_file():
            _check_digest(local, artifact.digest, str(local))
            return local
        local.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=".tmp-")
        os.close(fd)
        key = _object_key(artifact.digest)

        def download() -> bool:
            from botocore.exceptions import ClientError

            try:
                self.client.download_file(self.bucket, self._key(key), tmp, Config=self.transfer)
            except ClientError as exc:
                if _missing(exc):
                    return False
                raise
            return True

        try:
            if not self._retry("download", key, download):
                raise ArtifactNotFoundError(
                    f"payload of {artifact.digest} missing from {self.root}")
            _check_digest(Path(tmp), artifact.digest, self._url(key))
            os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return local

    def set_ref(self, name: str, digest: str) -> None:
        """Point reference ``name`` at ``digest`` (one PUT: S3 objects appear whole)."""
        self._put(_ref_key(name), (digest + "\n").encode())

    def get_ref(self, name: str) -> str | None:
        """The digest reference ``name`` points at, or None."""
        key = _ref_key(name)
        body = self._read(key)
        return None if body is None else _parse_ref(body, self._url(key))


def open_store(uri: str, cache_dir: Path, endpoint_url: str | None = None) -> ArtifactStore:
    """The store for ``uri``: ``s3://bucket/prefix`` or a local folder."""
    if uri.startswith("s3://"):
        return S3Store(uri, cache_dir=cache_dir, endpoint_url=endpoint_url)
    return LocalStore(uri)
