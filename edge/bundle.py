"""Policy bundles: one deterministic tar holding ``manifest.json`` and the payload files.

Layout: ``manifest.json`` is the first member, then the payload members sorted by name; every
member is a regular file with mtime 0, uid/gid 0, empty owner names and mode 0o644, in an
uncompressed POSIX (pax) tar. The manifest is canonical JSON (sorted keys, no whitespace)
and carries, beside the caller's fields, ``format_version`` and a ``files`` map
``{member name: {"sha256": hex digest, "bytes": size}}`` covering every payload member.
The same inputs always give a byte-identical tar, so its sha256 identifies the bundle.

Readers trust nothing: the file is read once, and every member's name, type, size and digest
is checked against the manifest, within a per-member and a total cap
(:data:`MAX_TOTAL_BYTES`, or the environment's :data:`MAX_TOTAL_BYTES_VAR`), before anything
is written; the checks are the robot runtime's own (:mod:`edge.runtime`).

A signed bundle has one more member, last and not listed in the manifest: ``bundle.sig``, an
OpenSSF model-signing signature (key-based, elliptic curve, e.g. P-256) over the manifest and
every listed member. The library ``model-signing`` makes and checks it; given a trust key
(a PEM public key), readers refuse an unsigned bundle, another key's signature and any content
the signature does not cover. Everything that runs a bundle requires a trust key or an
explicit ``allow_unsigned``. ECDSA signatures differ at each signing, so a signed bundle's
bytes do too; an unsigned one is byte-identical for identical inputs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from edge.errors import BundleError
from edge.files import atomic_output, sha256_file
from edge.runtime import (  # one copy of the checks the robot runs, which stays standalone
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_MEMBER_BYTES,
    SIGNATURE_NAME,
    BundleBytes,
    RuntimeRefusal,
    authenticate,
    check_manifest_fields,
    check_signature,
    path_conflict,
    read_bundle,
    strict_json,
    write_members,
)
from edge.runtime import member_name_problem as _name_problem
from physai_core.errors import one_line, printable

__all__ = [
    "canonical_json",
    "extract_bundle",
    "member_differences",
    "open_bundle",
    "read_manifest",
    "unpack_bundle",
    "verify_bundle",
    "write_bundle",
]

T = TypeVar("T")

_RESERVED_FIELDS = ("files", "format_version")


def write_bundle(
    out_path: Path, files: Mapping[str, Path], manifest: Mapping[str, object],
    *, signing_key: Path | None = None,
) -> str:
    """Write a bundle of ``files`` (member name -> source file) and ``manifest`` to ``out_path``.

    The tar is written to a temporary file beside ``out_path`` and renamed over it, so
    readers never see a partial bundle. ``manifest`` must be JSON-serialisable and must not
    set ``files`` or ``format_version``, which are added here. With ``signing_key`` (a PEM
    elliptic-curve private key file) the bundle is signed (``bundle.sig``, see the module
    docstring). Returns the tar's sha256.
    """
    reserved = [field for field in _RESERVED_FIELDS if field in manifest]
    if reserved:
        raise _error(out_path, MANIFEST_NAME, f"field {reserved[0]!r} is set by write_bundle")
    sizes: dict[str, int] = {}
    entries: dict[str, dict[str, object]] = {}
    for name in sorted(files):
        problem = _name_problem(name)
        if problem:
            raise _error(out_path, name, problem)
        source = Path(files[name])
        if not source.is_file():
            raise _error(out_path, name, f"payload file not found: {source}")
        sizes[name] = source.stat().st_size
        entries[name] = {"sha256": sha256_file(source), "bytes": sizes[name]}
    conflict = path_conflict(sizes)
    if conflict:
        raise _error(out_path, conflict, "is both a file and a folder of other members")
    try:
        data = canonical_json({**manifest, "files": entries, "format_version": FORMAT_VERSION})
    except (TypeError, ValueError) as exc:
        raise _error(out_path, MANIFEST_NAME, f"not JSON-serialisable: {one_line(exc)}") from exc
    if SIGNATURE_NAME in sizes:
        raise _error(out_path, SIGNATURE_NAME, "name is reserved for the signature")
    signature = _sign(out_path, data, files, signing_key) if signing_key is not None else None
    with atomic_output(out_path) as tmp:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(_tar_info(MANIFEST_NAME, len(data)), io.BytesIO(data))
            for name, size in sizes.items():
                with Path(files[name]).open("rb") as stream:
                    tar.addfile(_tar_info(name, size), stream)
            if signature is not None:
                tar.addfile(_tar_info(SIGNATURE_NAME, len(signature)), io.BytesIO(signature))
        return sha256_file(tmp)


def _sign(out_path: Path, manifest: bytes, files: Mapping[str, Path], key: Path) -> bytes:
    """The model-signing signature, made with ``key``, of the bundle's manifest and members as
    they will be extracted. The key file is read by the library only; its path, never its
    contents, appears in errors."""
    if not Path(key).is_file():
        raise _error(out_path, SIGNATURE_NAME, f"signing key file not found: {key}")
    try:
        from model_signing import hashing, signing
    except ImportError as exc:
        raise _error(out_path, SIGNATURE_NAME, "signing needs the model-signing package (a "
                                               "dependency of physai-flows): pip install "
                                               "model-signing==1.1.1") from exc
    with tempfile.TemporaryDirectory(prefix="physai-sign-") as scratch:
        folder = Path(scratch) / "bundle"
        folder.mkdir()
        (folder / MANIFEST_NAME).write_bytes(manifest)
        for name, source in files.items():
            target = folder.joinpath(*name.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        sig = Path(scratch) / SIGNATURE_NAME
        try:
            every_file = hashing.Config().set_ignored_paths(paths=[], ignore_git_paths=False)
            config = (signing.Config().set_hashing_config(every_file)
                      .use_elliptic_key_signer(private_key=key))
            _deterministic(config)
            with _sorted_statement_json():
                config.sign(folder, sig)
        except Exception as exc:  # the library's own and cryptography's errors
            raise _error(out_path, SIGNATURE_NAME, f"cannot sign with {key}: "
                                                   f"{type(exc).__name__}") from None
        return sig.read_bytes()


class _DeterministicKey:
    """An EC private key whose ECDSA signatures are deterministic (RFC 6979), so that one key
    signing the same bundle twice writes the same bytes: a re-packaged policy keeps its bundle
    digest, and two runs that package it at once publish one artifact."""

    def __init__(self, key: Any) -> None:
        self._key = key

    def public_key(self) -> Any:
        """The key's public half, as the signer embeds it."""
        return self._key.public_key()

    def sign(self, data: bytes, algorithm: Any) -> bytes:
        """ECDSA over ``data`` with ``algorithm``'s hash, its nonce derived from key and data."""
        from cryptography.hazmat.primitives.asymmetric import ec

        return bytes(self._key.sign(data, ec.ECDSA(algorithm.algorithm,
                                                   deterministic_signing=True)))


def _deterministic(config: Any) -> None:
    """Make the EC signer of a model-signing ``signing.Config`` sign deterministically.

    model-signing (pinned at 1.1.1) offers no such option; its signer keeps the loaded key as
    ``_private_key`` and calls only its ``sign`` and ``public_key``. A signer without that
    attribute signs as the library does, with a random nonce: as secure, only not repeatable."""
    signer = getattr(config, "_signer", None)
    key = getattr(signer, "_private_key", None)
    if key is not None and hasattr(key, "sign"):
        signer._private_key = _DeterministicKey(key)  # type: ignore[union-attr]


_SIGNING = threading.Lock()


@contextlib.contextmanager
def _sorted_statement_json() -> Iterator[None]:
    """While signing, model-signing's EC signer serializes the signed statement with sorted keys.

    It writes the statement with protobuf's ``MessageToJson``, whose key order follows the
    statement's maps and differs from one process to the next; sorted, the signed bytes depend
    on the content alone. Verification reads the signed bytes as they are, whatever their order.
    """
    try:
        from model_signing._signing import sign_ec_key
    except ImportError:
        yield
        return
    real = getattr(sign_ec_key, "json_format", None)
    if real is None or not hasattr(real, "MessageToJson"):
        yield
        return

    def sorted_json(message: Any, **options: Any) -> str:
        return str(real.MessageToJson(message, **{**options, "sort_keys": True}))

    with _SIGNING:
        sign_ec_key.json_format = types.SimpleNamespace(MessageToJson=sorted_json)
        try:
            yield
        finally:
            sign_ec_key.json_format = real


def read_manifest(path: Path) -> dict[str, Any]:
    """The bundle's manifest, checked for shape but without reading the payload."""
    with _open(path) as tar:
        return _guarded(path, lambda: _read_manifest_member(path, tar))


def open_bundle(
    path: Path,
    *,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_total_bytes: int | None = None,
    trust_key: Path | None = None,
    allow_unsigned: bool | None = None,
) -> BundleBytes:
    """Read the bundle file once and check it whole in memory (:func:`edge.runtime.read_bundle`
    and, with ``trust_key``, its signature); nothing is written.

    ``allow_unsigned`` None checks integrity only (for inspection, never to run it); True or
    False apply the rule of everything that runs a bundle (:func:`edge.runtime.authenticate`):
    without ``trust_key`` it is refused unless True. Raises :class:`BundleError`.
    """
    try:
        bundle = read_bundle(Path(path), max_member_bytes=max_member_bytes,
                             max_total_bytes=max_total_bytes)
        if allow_unsigned is not None:
            authenticate(bundle, trust_key, allow_unsigned)
        elif trust_key is not None:
            check_signature(bundle, Path(trust_key))
    except RuntimeRefusal as exc:
        raise BundleError(printable(str(exc))) from None
    return bundle


def verify_bundle(
    path: Path,
    *,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_total_bytes: int | None = None,
    trust_key: Path | None = None,
) -> dict[str, Any]:
    """Check every member against the manifest and return the manifest.

    Refuses unsafe names, anything but plain regular files (sparse ones included), duplicate,
    missing or unlisted members, sizes over the caps or different from the manifest, and
    digest mismatches; with ``trust_key``, also an unsigned bundle or a signature that
    ``trust_key`` does not verify over exactly this content. Reads the file once and writes
    nothing.
    """
    return open_bundle(path, max_member_bytes=max_member_bytes, max_total_bytes=max_total_bytes,
                       trust_key=trust_key).manifest


def member_differences(bundle: BundleBytes,
                       expected: Mapping[str, bytes | None]) -> dict[str, str]:
    """Member name -> one line saying how it differs, for each member of ``bundle`` (the
    manifest included) that ``expected`` does not name or whose bytes are not ``expected[name]``
    byte for byte (None: any bytes), in the bundle's member order; empty when every member is
    as expected. A member ``expected`` names that the bundle lacks is no difference: nothing of
    it can run. A differing member's line gives its first differing line, as the bundle has it.
    """
    found = {}
    for name, view in bundle.members.items():
        want = expected.get(name)
        if name not in expected:
            found[name] = f"member {name!r} is not one this version packs"
        elif want is not None and bytes(view) != want:
            found[name] = (f"member {name!r} differs from what this version packs "
                           f"({_first_difference(bytes(view), want)})")
    return {name: printable(line) for name, line in found.items()}


def _first_difference(got: bytes, want: bytes) -> str:
    """Where ``got`` first departs from ``want``, line by line: the line's number and, cut to
    60 characters, what ``got`` has there."""
    mine, theirs = got.splitlines(keepends=True), want.splitlines(keepends=True)
    at = next((k for k, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
              min(len(mine), len(theirs)))
    if at >= len(mine):
        return f"it ends after line {at}, before this version's does"
    text = mine[at].decode("utf-8", "replace").strip()
    shown = text if len(text) <= 60 else text[:57] + "..."
    return f"first at line {at + 1}: {shown!r}"


def unpack_bundle(
    path: Path,
    dest: Path,
    *,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_total_bytes: int | None = None,
    trust_key: Path | None = None,
) -> dict[str, Any]:
    """Verify the bundle (see :func:`verify_bundle`), then extract it into the new folder
    ``dest``; return the manifest.

    Every check, the signature's included, runs on the bytes read before anything is
    written; the signature member itself is not extracted. ``dest`` must not exist and its
    parent must; ``manifest.json`` is extracted with the payload.
    """
    _check_destination(path, dest)
    bundle = open_bundle(path, max_member_bytes=max_member_bytes,
                         max_total_bytes=max_total_bytes, trust_key=trust_key)
    extract_bundle(bundle, dest)
    return bundle.manifest


def extract_bundle(bundle: BundleBytes, dest: Path) -> None:
    """Write a bundle :func:`open_bundle` checked into the new folder ``dest``.

    Members go to a temporary folder inside ``dest``'s parent, renamed to ``dest`` once all
    are written; on any failure it is removed and nothing is left behind.
    """
    _check_destination(bundle.path, dest)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    try:
        write_members(bundle, staging)
        staging.chmod(0o755)
        os.replace(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def _check_destination(path: Path, dest: Path) -> None:
    if dest.exists() or dest.is_symlink():
        raise _error(path, "", f"destination already exists: {dest}")
    if not dest.parent.is_dir():
        raise _error(path, "", f"destination folder's parent does not exist: {dest.parent}")


def canonical_json(obj: object) -> bytes:
    """Sorted-key JSON without whitespace or NaN, UTF-8 encoded: the manifest's byte form."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _error(path: Path, member: str, problem: str) -> BundleError:
    """A one-line bundle error naming the bundle file and, when known, the member."""
    where = f"{path}: member {member!r}" if member else str(path)
    return BundleError(printable(f"{where}: {problem}"))


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
    """Header of a regular-file member with every varying field pinned."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def _open(path: Path) -> tarfile.TarFile:
    """Open ``path`` as an uncompressed tar, or raise a :class:`BundleError`."""
    if not path.is_file():
        raise _error(path, "", "bundle file not found")
    try:
        return tarfile.open(path, "r:")
    except tarfile.TarError as exc:
        raise _error(path, "", f"not an uncompressed tar archive: {one_line(exc)}") from exc


def _guarded(path: Path, read: Callable[[], T]) -> T:
    """Call ``read()``, turning tar-level corruption into a :class:`BundleError`."""
    try:
        result = read()
    except (tarfile.TarError, EOFError) as exc:
        raise _error(path, "", f"corrupt tar archive: {one_line(exc)}") from exc
    return result


def _read_manifest_member(path: Path, tar: tarfile.TarFile) -> dict[str, Any]:
    """Parse and check the first member, which must be the manifest."""
    member = tar.next()
    if member is None:
        raise _error(path, MANIFEST_NAME, "missing (the archive is empty)")
    if member.name != MANIFEST_NAME:
        raise _error(path, member.name, f"first member must be {MANIFEST_NAME!r}")
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.sparse is not None:
        raise _error(path, MANIFEST_NAME, "not a plain regular file")
    if member.size > MAX_MANIFEST_BYTES:
        raise _error(path, MANIFEST_NAME, f"{member.size} bytes exceeds {MAX_MANIFEST_BYTES}")
    stream = tar.extractfile(member)
    data = stream.read() if stream is not None else b""
    try:
        manifest = strict_json(data)
        return check_manifest_fields(path, manifest)
    except ValueError as exc:
        raise _error(path, MANIFEST_NAME, f"invalid JSON: {one_line(exc)}") from exc
    except RuntimeRefusal as exc:
        raise BundleError(printable(str(exc))) from None
