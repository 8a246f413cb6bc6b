"""Policy bundles: one deterministic tar holding ``manifest.json`` and the payload files.

Layout: ``manifest.json`` is the first member, then the payload members sorted by name; every
member is a regular file with mtime 0, uid/gid 0, empty owner names and mode 0o644, in an
uncompressed POSIX (pax) tar. The manifest is canonical JSON (sorted keys, no whitespace)
and carries, beside the caller's fields, ``format_version`` and a ``files`` map
``{member name: {"sha256": hex digest, "bytes": size}}`` covering every payload member.
The same inputs always give a byte-identical tar, so its sha256 identifies the bundle.

Readers trust nothing: every member's name, type, size and digest is checked against the
manifest, and unpacking writes nothing unless the whole bundle checks out.

A signed bundle has one more member, last and not listed in the manifest: ``bundle.sig``, an
OpenSSF model-signing signature (key-based, elliptic curve, e.g. P-256) over the manifest and
every listed member. The library ``model-signing`` makes and checks it; given a trust key
(a PEM public key), readers refuse an unsigned bundle, another key's signature and any content
the signature does not cover. ECDSA signatures differ at each signing, so a signed bundle's
bytes do too; an unsigned one is byte-identical for identical inputs.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from edge.errors import BundleError, one_line, printable
from edge.files import atomic_output, sha256_file, sha256_stream
from edge.runtime import (  # one copy of the checks the robot runs, which stays standalone
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_MEMBER_BYTES,
    REGULAR_TYPES,
    SIGNATURE_NAME,
    RuntimeRefusal,
    read_signature_member,
    strict_json,
    verify_signature,
)
from edge.runtime import member_name_problem as _name_problem

T = TypeVar("T")

MAX_TOTAL_BYTES = 1 << 30
"""Default cap on the summed size of all members when verifying or unpacking (1 GiB)."""

_RESERVED_FIELDS = ("files", "format_version")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_KINDS = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
    tarfile.DIRTYPE: "directory",
    tarfile.CONTTYPE: "contiguous file",
    tarfile.GNUTYPE_SPARSE: "sparse file",
}


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
    conflict = _path_conflict(sizes)
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
        from model_signing import signing
    except ImportError as exc:
        raise _error(out_path, SIGNATURE_NAME, "signing needs the model-signing package: pip "
                                               "install 'physai-flows[signing]'") from exc
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
            signing.Config().use_elliptic_key_signer(private_key=key).sign(folder, sig)
        except Exception as exc:  # the library's own and cryptography's errors
            raise _error(out_path, SIGNATURE_NAME, f"cannot sign with {key}: "
                                                   f"{type(exc).__name__}") from None
        return sig.read_bytes()


def read_manifest(path: Path) -> dict[str, Any]:
    """The bundle's manifest, checked for shape but without reading the payload."""
    with _open(path) as tar:
        return _guarded(path, lambda: _read_manifest_member(path, tar)[0])


def verify_bundle(
    path: Path,
    *,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    trust_key: Path | None = None,
) -> dict[str, Any]:
    """Check every member against the manifest and return the manifest.

    Refuses unsafe names, anything but regular files, duplicate, missing or unlisted members,
    sizes over the caps or different from the manifest, and digest mismatches; with
    ``trust_key``, also an unsigned bundle or a signature that ``trust_key`` does not verify
    over exactly this content (the bundle is then unpacked into a temporary folder).
    """
    if trust_key is not None:
        with tempfile.TemporaryDirectory(prefix="physai-verify-") as scratch:
            return unpack_bundle(path, Path(scratch) / "bundle", max_member_bytes=max_member_bytes,
                                 max_total_bytes=max_total_bytes, trust_key=trust_key)
    with _open(path) as tar:
        return _guarded(path, lambda: _scan(path, tar, max_member_bytes, max_total_bytes,
                                            None)[0])


def unpack_bundle(
    path: Path,
    dest: Path,
    *,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    trust_key: Path | None = None,
) -> dict[str, Any]:
    """Verify the bundle while extracting it into the new folder ``dest``; return the manifest.

    With ``trust_key`` the signature is checked too (see :func:`verify_bundle`) before
    ``dest`` appears; the signature member itself is not extracted.

    ``dest`` must not exist and its parent must. Members are extracted into a temporary
    folder inside the parent, which is renamed to ``dest`` only when every check of
    :func:`verify_bundle` passes; on any failure it is removed and nothing is left behind.
    ``manifest.json`` is extracted with the payload.
    """
    if dest.exists() or dest.is_symlink():
        raise _error(path, "", f"destination already exists: {dest}")
    if not dest.parent.is_dir():
        raise _error(path, "", f"destination folder's parent does not exist: {dest.parent}")
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    try:
        with _open(path) as tar:
            manifest, signature = _guarded(
                path, lambda: _scan(path, tar, max_member_bytes, max_total_bytes, staging)
            )
        if trust_key is not None:
            try:
                verify_signature(path, staging, signature, Path(trust_key))
            except RuntimeRefusal as exc:
                raise BundleError(str(exc)) from None
        staging.chmod(0o755)
        os.replace(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return manifest


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


def _path_conflict(names: Mapping[str, object]) -> str | None:
    """A member name that is also a parent folder of another member, or None."""
    folders = {str(parent) for name in names for parent in PurePosixPath(name).parents}
    clashes = sorted(folders.intersection(names))
    return clashes[0] if clashes else None


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


def _read_manifest_member(path: Path, tar: tarfile.TarFile) -> tuple[dict[str, Any], bytes]:
    """Parse and check the first member, which must be the manifest; also return its bytes."""
    member = tar.next()
    if member is None:
        raise _error(path, MANIFEST_NAME, "missing (the archive is empty)")
    if member.name != MANIFEST_NAME:
        raise _error(path, member.name, f"first member must be {MANIFEST_NAME!r}")
    if member.type not in REGULAR_TYPES:
        raise _error(path, MANIFEST_NAME, f"not a regular file ({_kind(member)})")
    if member.size > MAX_MANIFEST_BYTES:
        raise _error(path, MANIFEST_NAME, f"{member.size} bytes exceeds {MAX_MANIFEST_BYTES}")
    stream = tar.extractfile(member)
    data = stream.read() if stream is not None else b""
    try:
        manifest = strict_json(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _error(path, MANIFEST_NAME, f"invalid JSON: {one_line(exc)}") from exc
    return _check_manifest(path, manifest), data


def _check_manifest(path: Path, manifest: object) -> dict[str, Any]:
    """Check the fields this module owns: ``format_version`` and the ``files`` map."""
    if not isinstance(manifest, dict):
        raise _error(
            path, MANIFEST_NAME, f"must be a JSON object (value: {type(manifest).__name__})"
        )
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise _error(
            path,
            MANIFEST_NAME,
            f"field 'format_version' must be {FORMAT_VERSION} (value: {version!r})",
        )
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise _error(path, MANIFEST_NAME, f"field 'files' must be an object (value: {files!r})")
    for name, entry in files.items():
        field = f"field 'files.{name}'"
        problem = _name_problem(name)
        if problem:
            raise _error(path, MANIFEST_NAME, f"{field}: {problem}")
        if not isinstance(entry, dict) or sorted(entry) != ["bytes", "sha256"]:
            raise _error(path, MANIFEST_NAME, f"{field} must hold exactly 'bytes' and 'sha256'")
        digest, size = entry["sha256"], entry["bytes"]
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise _error(
                path,
                MANIFEST_NAME,
                f"{field}.sha256 must be 64 lowercase hex digits (value: {digest!r})",
            )
        if type(size) is not int or size < 0:
            raise _error(
                path, MANIFEST_NAME, f"{field}.bytes must be an integer >= 0 (value: {size!r})"
            )
    conflict = _path_conflict(files)
    if conflict:
        raise _error(path, MANIFEST_NAME, f"field 'files.{conflict}' is both a file and a folder")
    return manifest


def _kind(member: tarfile.TarInfo) -> str:
    """Human name of a tar member's type."""
    return _KINDS.get(member.type, f"tar type {member.type!r}")


def _scan(
    path: Path,
    tar: tarfile.TarFile,
    max_member_bytes: int,
    max_total_bytes: int,
    into: Path | None,
) -> tuple[dict[str, Any], bytes | None]:
    """Check every member against the manifest, copying each into ``into`` when given; return
    the manifest and the signature member's bytes (None when unsigned)."""
    manifest, manifest_bytes = _read_manifest_member(path, tar)
    listed: dict[str, dict[str, Any]] = manifest["files"]
    total = len(manifest_bytes)
    cap = min(max_member_bytes, max_total_bytes)
    if total > cap:
        raise _error(path, MANIFEST_NAME, f"{total} bytes exceeds the cap {cap}")
    if into is not None:
        (into / MANIFEST_NAME).write_bytes(manifest_bytes)
    seen = {MANIFEST_NAME}
    signature: bytes | None = None
    while (member := tar.next()) is not None:
        name = member.name
        if signature is not None:
            raise _error(path, name, f"follows {SIGNATURE_NAME}, which must be the last member")
        if name == SIGNATURE_NAME and name not in listed:
            try:
                signature = read_signature_member(path, tar, member)
            except RuntimeRefusal as exc:
                raise BundleError(str(exc)) from None
            continue
        if name in seen:
            raise _error(path, name, "duplicate member")
        problem = _name_problem(name)
        if problem:
            raise _error(path, name, problem)
        seen.add(name)
        if member.type not in REGULAR_TYPES:
            raise _error(path, name, f"not a regular file ({_kind(member)})")
        entry = listed.get(name)
        if entry is None:
            raise _error(path, name, "not listed in the manifest")
        if member.size > max_member_bytes:
            raise _error(
                path, name, f"{member.size} bytes exceeds the member cap {max_member_bytes}"
            )
        total += member.size
        if total > max_total_bytes:
            raise _error(
                path, name, f"bundle total {total} bytes exceeds the cap {max_total_bytes}"
            )
        if member.size != entry["bytes"]:
            raise _error(
                path, name, f"size {member.size} differs from the manifest's {entry['bytes']}"
            )
        digest = _copy_member(tar, member, into)
        if digest != entry["sha256"]:
            raise _error(
                path, name, f"sha256 {digest} differs from the manifest's {entry['sha256']}"
            )
    missing = sorted(set(listed) - seen)
    if missing:
        raise _error(path, missing[0], "listed in the manifest but missing from the archive")
    return manifest, signature


def _copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, into: Path | None) -> str:
    """Hex sha256 of a regular member's data, also written under ``into`` when given."""
    stream = tar.extractfile(member)
    if stream is None:
        raise tarfile.ReadError(f"cannot read member {member.name!r}")
    if into is None:
        return sha256_stream(stream)[0]
    target = into.joinpath(*member.name.split("/"))
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("xb") as out:
        return sha256_stream(stream, out)[0]
