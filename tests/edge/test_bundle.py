"""Bundles: deterministic writing, manifest reading, verification and hostile-archive refusal."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edge.bundle import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    canonical_json,
    read_manifest,
    unpack_bundle,
    verify_bundle,
    write_bundle,
)
from edge.errors import BundleError, EdgeError

PAYLOAD = {
    "policy.onnx": b"\x08\x07onnx-bytes" * 50,
    "meta/io.json": b'{"obs":11,"actions":3}',
}
FIELDS: dict[str, object] = {"control_hz": 50, "target": "jetson-agx-thor", "io": {"obs": 11}}

Entry = tuple[tarfile.TarInfo, bytes | None]


def _sources(root: Path, payload: dict[str, bytes] = PAYLOAD) -> dict[str, Path]:
    """Write each payload member to its own file under ``root``."""
    sources = {}
    for i, (name, data) in enumerate(sorted(payload.items())):
        source = root / f"source-{i}.bin"
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(data)
        sources[name] = source
    return sources


def _files_map(payload: dict[str, bytes]) -> dict[str, dict[str, object]]:
    return {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        for name, data in payload.items()
    }


def _manifest_bytes(payload: dict[str, bytes] = PAYLOAD, **overrides: Any) -> bytes:
    manifest = {**FIELDS, "files": _files_map(payload), "format_version": FORMAT_VERSION}
    return canonical_json(manifest | overrides)


def _entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, **attrs: Any) -> Entry:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data if kind == tarfile.REGTYPE else None


def _tar(path: Path, entries: list[Entry]) -> Path:
    """Write a tar by hand, exactly as listed: no checks, any member type."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _valid_entries(payload: dict[str, bytes] = PAYLOAD) -> list[Entry]:
    return [_entry(MANIFEST_NAME, _manifest_bytes(payload))] + [
        _entry(name, data) for name, data in sorted(payload.items())
    ]


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "policy.bundle.tar"
    write_bundle(path, _sources(tmp_path / "src"), FIELDS)
    return path


def test_same_inputs_give_byte_identical_bundles(tmp_path: Path) -> None:
    first = tmp_path / "a" / "bundle.tar"
    second = tmp_path / "b" / "bundle.tar"
    digest = write_bundle(first, _sources(tmp_path / "src-a"), dict(FIELDS))
    again = write_bundle(second, _sources(tmp_path / "src-b"), dict(reversed(FIELDS.items())))
    assert first.read_bytes() == second.read_bytes()
    assert digest == again == hashlib.sha256(first.read_bytes()).hexdigest()
    assert sorted(p.name for p in first.parent.iterdir()) == ["bundle.tar"]


def test_different_payload_gives_a_different_digest(tmp_path: Path) -> None:
    digest = write_bundle(tmp_path / "a.tar", _sources(tmp_path / "a"), FIELDS)
    changed = PAYLOAD | {"policy.onnx": PAYLOAD["policy.onnx"] + b"!"}
    other = write_bundle(tmp_path / "b.tar", _sources(tmp_path / "b", changed), FIELDS)
    assert digest != other


def test_tar_layout_is_pinned(bundle: Path) -> None:
    with tarfile.open(bundle) as tar:
        members = tar.getmembers()
        manifest_data = tar.extractfile(members[0]).read()  # type: ignore[union-attr]
    assert [m.name for m in members] == [MANIFEST_NAME, "meta/io.json", "policy.onnx"]
    for member in members:
        assert (member.mtime, member.uid, member.gid, member.mode) == (0, 0, 0, 0o644)
        assert (member.uname, member.gname, member.type) == ("", "", tarfile.REGTYPE)
    assert manifest_data == _manifest_bytes()


def test_manifest_records_digests_and_keeps_caller_fields(bundle: Path) -> None:
    manifest = read_manifest(bundle)
    assert manifest == {**FIELDS, "files": _files_map(PAYLOAD), "format_version": 1}
    assert "files" not in FIELDS
    assert verify_bundle(bundle) == manifest


def test_write_replaces_an_existing_bundle(bundle: Path, tmp_path: Path) -> None:
    write_bundle(bundle, _sources(tmp_path / "again"), FIELDS | {"control_hz": 100})
    assert read_manifest(bundle)["control_hz"] == 100


@pytest.mark.parametrize(
    ("files", "fields", "fragment"),
    [
        ({}, {"files": {}}, "member 'manifest.json': field 'files' is set by write_bundle"),
        ({}, {"format_version": 2}, "field 'format_version' is set by write_bundle"),
        ({}, {"when": object()}, "member 'manifest.json': not JSON-serialisable"),
        ({}, {"gain": float("nan")}, "member 'manifest.json': not JSON-serialisable"),
        ({"../up": "policy.onnx"}, {}, "member '../up': empty, '.' or '..' path component"),
        ({"/abs": "policy.onnx"}, {}, "member '/abs': absolute path"),
        ({MANIFEST_NAME: "policy.onnx"}, {}, "reserved for the manifest"),
        ({"a": "policy.onnx", "a/b": "policy.onnx"}, {}, "member 'a': is both a file"),
        ({"x": "absent.bin"}, {}, "member 'x': payload file not found"),
    ],
)
def test_write_refuses_bad_input_and_writes_nothing(
    tmp_path: Path, files: dict[str, str], fields: dict[str, object], fragment: str
) -> None:
    (tmp_path / "policy.onnx").write_bytes(b"x")
    out = tmp_path / "out" / "bundle.tar"
    sources = {name: tmp_path / source for name, source in files.items()}
    with pytest.raises(BundleError) as caught:
        write_bundle(out, sources, fields)
    assert fragment in str(caught.value) and str(out) in str(caught.value)
    assert not out.parent.exists()


def test_payload_tampered_inside_a_rebuilt_tar_fails(tmp_path: Path) -> None:
    flipped = bytearray(PAYLOAD["policy.onnx"])
    flipped[10] ^= 0x01
    entries = _valid_entries()
    entries[2] = _entry("policy.onnx", bytes(flipped))
    path = _tar(tmp_path / "tampered.tar", entries)
    with pytest.raises(BundleError, match=r"member 'policy.onnx': sha256 [0-9a-f]{64} differs"):
        verify_bundle(path)
    assert read_manifest(path)["files"]["policy.onnx"]["bytes"] == len(flipped)


def test_byte_flipped_in_the_tar_file_fails(bundle: Path) -> None:
    data = bytearray(bundle.read_bytes())
    offset = data.find(PAYLOAD["policy.onnx"])
    data[offset + 3] ^= 0x80
    bundle.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=re.escape("member 'policy.onnx': sha256")):
        verify_bundle(bundle)


def _replace(name: str, entry: Entry) -> Callable[[list[Entry]], list[Entry]]:
    return lambda entries: [entry if info.name == name else (info, data) for info, data in entries]


def _append(*extra: Entry) -> Callable[[list[Entry]], list[Entry]]:
    return lambda entries: [*entries, *extra]


HOSTILE: dict[str, tuple[Callable[[list[Entry]], list[Entry]], str, str]] = {
    "absolute": (_append(_entry("/etc/evil", b"x")), "/etc/evil", "absolute path"),
    "dotdot": (_append(_entry("../evil", b"x")), "../evil", "'..' path component"),
    "nested-dotdot": (_append(_entry("meta/../../x", b"x")), "meta/../../x", "'..' path"),
    "symlink": (
        _append(_entry("link", kind=tarfile.SYMTYPE, linkname="/etc/passwd")),
        "link",
        "not a regular file (symbolic link)",
    ),
    "hardlink": (
        _append(_entry("hard", kind=tarfile.LNKTYPE, linkname="policy.onnx")),
        "hard",
        "not a regular file (hard link)",
    ),
    "char-device": (
        _append(_entry("tty", kind=tarfile.CHRTYPE, devmajor=5, devminor=0)),
        "tty",
        "(character device)",
    ),
    "block-device": (_append(_entry("sda", kind=tarfile.BLKTYPE)), "sda", "(block device)"),
    "fifo": (_append(_entry("pipe", kind=tarfile.FIFOTYPE)), "pipe", "(FIFO)"),
    "directory": (_append(_entry("extra", kind=tarfile.DIRTYPE)), "extra", "(directory)"),
    "unlisted": (_append(_entry("extra.bin", b"x")), "extra.bin", "not listed in the manifest"),
    "duplicate": (
        _append(_entry("policy.onnx", PAYLOAD["policy.onnx"])),
        "policy.onnx",
        "duplicate member",
    ),
    "second-manifest": (
        _append(_entry(MANIFEST_NAME, _manifest_bytes())),
        MANIFEST_NAME,
        "duplicate member",
    ),
    "missing": (
        lambda entries: [e for e in entries if e[0].name != "policy.onnx"],
        "policy.onnx",
        "listed in the manifest but missing",
    ),
    "digest": (
        _replace("policy.onnx", _entry("policy.onnx", PAYLOAD["policy.onnx"][::-1])),
        "policy.onnx",
        "differs from the manifest's",
    ),
    "size": (
        _replace("meta/io.json", _entry("meta/io.json", b"{}")),
        "meta/io.json",
        "size 2 differs from the manifest's 22",
    ),
    "manifest-not-first": (
        lambda entries: [*entries[1:], entries[0]],
        "meta/io.json",
        "first member must be 'manifest.json'",
    ),
    "manifest-json": (
        _replace(MANIFEST_NAME, _entry(MANIFEST_NAME, b"{not json")),
        MANIFEST_NAME,
        "invalid JSON",
    ),
    "manifest-duplicate-key": (
        _replace(
            MANIFEST_NAME,
            _entry(MANIFEST_NAME, _manifest_bytes()[:-1] + b',"format_version":1}'),
        ),
        MANIFEST_NAME,
        "duplicate key 'format_version'",
    ),
    "manifest-nan": (
        _replace(MANIFEST_NAME, _entry(MANIFEST_NAME, _manifest_bytes()[:-1] + b',"g":NaN}')),
        MANIFEST_NAME,
        "invalid JSON: non-finite number NaN",
    ),
    "manifest-version": (
        _replace(MANIFEST_NAME, _entry(MANIFEST_NAME, _manifest_bytes(format_version=99))),
        MANIFEST_NAME,
        "field 'format_version' must be 1 (value: 99)",
    ),
    "manifest-listing-escape": (
        _replace(
            MANIFEST_NAME,
            _entry(MANIFEST_NAME, _manifest_bytes(files=_files_map({"../x": b""}))),
        ),
        MANIFEST_NAME,
        "field 'files.../x': empty, '.' or '..' path component",
    ),
    "manifest-bad-digest": (
        _replace(
            MANIFEST_NAME,
            _entry(MANIFEST_NAME, _manifest_bytes(files={"a": {"sha256": "x", "bytes": 1}})),
        ),
        MANIFEST_NAME,
        "field 'files.a'.sha256 must be 64 lowercase hex digits",
    ),
    "manifest-symlink": (
        _replace(MANIFEST_NAME, _entry(MANIFEST_NAME, kind=tarfile.SYMTYPE, linkname="x")),
        MANIFEST_NAME,
        "not a regular file (symbolic link)",
    ),
}


@pytest.mark.parametrize("check", ["verify", "unpack"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_bundle_is_refused_and_nothing_is_written(
    tmp_path: Path, case: str, check: str
) -> None:
    build, member, fragment = HOSTILE[case]
    path = _tar(tmp_path / "hostile.tar", build(_valid_entries()))
    parent = tmp_path / "robot"
    parent.mkdir()
    with pytest.raises(BundleError) as caught:
        if check == "verify":
            verify_bundle(path)
        else:
            unpack_bundle(path, parent / "policy")
    message = str(caught.value)
    assert message.startswith(f"{path}: member {member!r}: "), message
    assert fragment in message and "\n" not in message
    assert list(parent.iterdir()) == []
    assert not (tmp_path / "etc").exists() and not (tmp_path / "evil").exists()


@pytest.mark.parametrize(
    ("caps", "member", "fragment"),
    [
        ({"max_member_bytes": 400}, "policy.onnx", "600 bytes exceeds the member cap 400"),
        ({"max_total_bytes": 600}, "policy.onnx", "bundle total 919 bytes exceeds the cap 600"),
        ({"max_total_bytes": 10}, MANIFEST_NAME, "297 bytes exceeds the cap 10"),
    ],
)
def test_size_caps(
    bundle: Path, tmp_path: Path, caps: dict[str, int], member: str, fragment: str
) -> None:
    dest = tmp_path / "robot" / "policy"
    dest.parent.mkdir()
    for call in (
        lambda: verify_bundle(bundle, **caps),
        lambda: unpack_bundle(bundle, dest, **caps),
    ):
        with pytest.raises(BundleError) as caught:
            call()
        assert str(caught.value).startswith(f"{bundle}: member {member!r}: ")
        assert fragment in str(caught.value)
    assert list(dest.parent.iterdir()) == []


def test_unpack_writes_payload_and_manifest(bundle: Path, tmp_path: Path) -> None:
    dest = tmp_path / "robot" / "policy-v1"
    dest.parent.mkdir()
    manifest = unpack_bundle(bundle, dest)
    assert manifest == read_manifest(bundle)
    for name, data in PAYLOAD.items():
        assert (dest / name).read_bytes() == data
    assert json.loads((dest / MANIFEST_NAME).read_bytes()) == manifest
    assert sorted(p.name for p in dest.parent.iterdir()) == ["policy-v1"]
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == sorted(
        [MANIFEST_NAME, *PAYLOAD]
    )


def test_unpack_refuses_existing_or_orphan_destination(bundle: Path, tmp_path: Path) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(BundleError, match="destination already exists"):
        unpack_bundle(bundle, existing)
    with pytest.raises(BundleError, match="parent does not exist"):
        unpack_bundle(bundle, tmp_path / "no" / "such" / "dest")
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "bundle file not found"),
        (b"", "not an uncompressed tar archive"),
        (b"plain text, not a tar" * 40, "not an uncompressed tar archive"),
        (gzip.compress(b"\0" * 2048, mtime=0), "not an uncompressed tar archive"),
    ],
)
def test_unreadable_files_are_refused(tmp_path: Path, content: bytes | None, fragment: str) -> None:
    path = tmp_path / "bundle.tar"
    if content is not None:
        path.write_bytes(content)
    for call in (read_manifest, verify_bundle):
        with pytest.raises(BundleError, match=fragment) as caught:
            call(path)
        assert str(caught.value).startswith(str(path))


def test_empty_archive_has_no_manifest(tmp_path: Path) -> None:
    path = _tar(tmp_path / "empty.tar", [])
    with pytest.raises(BundleError, match=re.escape("member 'manifest.json': missing")):
        read_manifest(path)


def test_truncated_archive_is_refused(bundle: Path) -> None:
    data = bundle.read_bytes()
    bundle.write_bytes(data[: data.find(PAYLOAD["policy.onnx"]) + 20])
    with pytest.raises(BundleError, match=r"corrupt tar archive|truncated"):
        verify_bundle(bundle)


def test_bundle_errors_exit_with_status_two() -> None:
    assert BundleError.exit_code == 2 and issubclass(BundleError, EdgeError)
    assert EdgeError.exit_code == 1
