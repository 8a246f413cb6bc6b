"""Fuzzing edge bundles: corrupted bytes, edited manifests and hostile members.

A bundle packed as the package stage packs it is mutated. Verification, unpacking, the full
check and the on-robot runtime must each accept it or refuse it with a one-line error naming
the bundle (exit status 2 for the CLI's errors), and refuse leaves nothing behind: no
destination folder, no staging folder, nothing in the runtime's work folder. Whatever
verification refuses, the runtime refuses too; whatever the full check accepts, the runtime
loads (told ``allow_unsigned``; by default it refuses every unsigned one); and a bundle that
verifies carries exactly the payload that was packed. A signed bundle, corrupted, runs with
its signer's key only as it was signed.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from edge.bundle import unpack_bundle, verify_bundle
from edge.errors import BundleError, EdgeError
from edge.manifest import check_bundle
from edge.runtime import MANIFEST_NAME, RuntimeRefusal, load_bundle
from tests.fuzz.fuzzing import (
    Blob,
    check_one_line,
    edited,
    examples,
    listing,
    text_edits,
)
from tests.support import keypair, policy_manifest_fields

if TYPE_CHECKING:
    from tests.fuzz.conftest import Tally

OBS_DIM, ACT_DIM = 4, 2
Member = tuple[tarfile.TarInfo, bytes | None]


def _manifest_fields(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Every manifest field the package stage writes (but files, format and engine)."""
    return policy_manifest_fields(state["mean"].tolist(), state["std"].tolist(), ACT_DIM,
                                  task="reach-v0", model_name="fuzz-policy")


class _Policy(torch.nn.Module):
    """A tiny normalised MLP. Shape: (batch, OBS_DIM) -> (batch, ACT_DIM)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("mean", torch.linspace(-1, 1, OBS_DIM))
        self.register_buffer("std", torch.linspace(0.5, 2, OBS_DIM))
        self.net = torch.nn.Sequential(torch.nn.Linear(OBS_DIM, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, ACT_DIM), torch.nn.Tanh())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Shape: (batch, OBS_DIM) -> (batch, ACT_DIM)."""
        return self.net((obs - self.mean) / self.std)


def _pack() -> bytes:
    """The bytes of a bundle packed as the package stage packs it."""
    from edge.calibration import draw_calibration_set
    from edge.export import export_onnx
    from edge.pack import pack_policy_bundle
    from edge.targets import get_target

    policy = _Policy()
    obs = np.random.default_rng(0).standard_normal((64, OBS_DIM)).astype(np.float32)
    with tempfile.TemporaryDirectory() as folder:
        onnx_path = export_onnx(policy, OBS_DIM, Path(folder) / "policy.onnx")
        out = Path(folder) / "policy.bundle.tar"
        pack_policy_bundle(out, onnx_path, draw_calibration_set(obs, 32), "dataset observations",
                           _manifest_fields(policy.state_dict()), get_target("jetson-agx-orin"))
        return out.read_bytes()


@pytest.fixture(scope="module")
def valid() -> Blob:
    """The valid bundle's bytes."""
    return Blob(_pack())


def _members(data: bytes) -> list[tuple[str, bytes]]:
    """(name, bytes) of every member of a tar, in order."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]


def _info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info


def _tar(members: list[Member]) -> bytes:
    """A tar of ``members`` exactly as listed: no checks, any member type."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


class Outcome:
    """What verification, unpacking, the full check and the runtime made of one bundle."""

    def __init__(self, path: Path, original: list[tuple[str, bytes]] | None) -> None:
        self.path = path
        root = path.parent
        before = listing(root)
        self.verified = self._refusal(lambda: verify_bundle(path))
        assert listing(root) == before
        dest = root / "unpacked"
        unpacked = self._refusal(lambda: unpack_bundle(path, dest))
        assert unpacked == self.verified, (unpacked, self.verified)
        if unpacked is None:
            payload = {p.relative_to(dest).as_posix(): p.read_bytes()
                       for p in dest.rglob("*") if p.is_file()}
            want = dict(original if original is not None else _members(path.read_bytes()))
            assert payload.keys() == want.keys()
            assert {k: v for k, v in payload.items() if k != MANIFEST_NAME} == {
                k: v for k, v in want.items() if k != MANIFEST_NAME}, "payload differs"
            for item in sorted(dest.rglob("*"), reverse=True):
                item.rmdir() if item.is_dir() else item.unlink()
            dest.rmdir()
        assert listing(root) == before
        self.checked = (self._refusal(lambda: check_bundle(path)) if self.verified is None
                        else self.verified)
        assert listing(root) == before
        work = root / "run"
        with pytest.raises(RuntimeRefusal):  # unsigned: nothing runs it by default
            load_bundle(path, work, providers=["CPUExecutionProvider"])
        assert not any(work.iterdir()), "the runtime left files behind"
        try:
            load_bundle(path, work, providers=["CPUExecutionProvider"], allow_unsigned=True)
        except RuntimeRefusal as exc:
            check_one_line(str(exc), path)
            assert not any(work.iterdir()), "the runtime left files behind"
            self.loaded: str | None = str(exc)
        else:
            self.loaded = None
        for item in sorted(work.rglob("*"), reverse=True):
            item.rmdir() if item.is_dir() else item.unlink()
        work.rmdir()
        assert listing(root) == before
        if self.verified is not None:
            assert self.loaded is not None, f"runtime ran what verify refused: {self.verified}"
        if self.checked is None:
            assert self.loaded is None, f"runtime refused a checked bundle: {self.loaded}"

    def _refusal(self, call: Any) -> str | None:
        try:
            call()
        except BundleError as exc:
            assert exc.exit_code == 2
            check_one_line(str(exc), self.path)
            return str(exc)
        except EdgeError as exc:
            raise AssertionError(f"not a BundleError: {exc!r}") from exc
        return None

    def record(self, tally: Tally, suite: str) -> None:
        """Count this bundle by the deepest check it passed."""
        outcome = ("ran" if self.loaded is None else "checked, runtime refused"
                   if self.checked is None else "verified, check refused"
                   if self.verified is None else "refused")
        tally.record(suite, outcome)


def _outcome(data: bytes, payload_of: bytes | None) -> Outcome:
    """What the checks make of the bundle ``data``, written to a fresh folder; a bundle that
    verifies must carry the payload of ``payload_of`` (None: its own members)."""
    folder = Path(tempfile.mkdtemp(prefix="physai-fuzz-bundle-"))
    try:
        path = folder / "policy.bundle.tar"
        path.write_bytes(data)
        return Outcome(path, None if payload_of is None else _members(payload_of))
    finally:
        for item in sorted(folder.rglob("*"), reverse=True):
            item.rmdir() if item.is_dir() else item.unlink()
        folder.rmdir()


def test_the_valid_bundle_runs(valid: bytes) -> None:
    outcome = _outcome(valid, valid)
    assert (outcome.verified, outcome.checked, outcome.loaded) == (None, None, None)


@examples(250)
@given(data=st.data())
def test_corrupted_bundle_bytes_are_refused_or_carry_the_packed_payload(
    valid: bytes, data: st.DataObject, tally: Tally
) -> None:
    corrupted = data.draw(text_edits(valid), label="bytes")
    _outcome(corrupted, valid).record(tally, "bundle (bytes)")


CROSS = {"target": {"target", "opset", "precision"}, "opset": {"opset", "target", "precision"},
         "precision": {"target", "precision"}, "io": {"io"}, "files": {"files"}}
"""Manifest fields that are checked against others: the target's row of the compatibility
matrix against opset and precision; io against the model's graph."""


def _manifest_tar(valid: bytes, manifest: Any, raw: bool) -> bytes:
    """``valid`` with its manifest member replaced by ``manifest`` as JSON (canonical, or with
    whatever Python's json writes, NaN included, when ``raw``)."""
    text = (json.dumps(manifest) if raw else
            json.dumps(manifest, sort_keys=True, separators=(",", ":"))).encode()
    members = _members(valid)
    return _tar([(_info(MANIFEST_NAME, len(text)), text),
                 *[(_info(n, len(d)), d) for n, d in members[1:]]])


@examples(300)
@given(data=st.data(), raw=st.booleans())
def test_edited_manifest_is_refused_naming_bundle_member_and_field(
    valid: bytes, data: st.DataObject, raw: bool, tally: Tally
) -> None:
    manifest = json.loads(_members(valid)[0][1])
    tree, edits = data.draw(edited(manifest), label="edits")
    try:
        bundle = _manifest_tar(valid, tree, raw)
    except (TypeError, ValueError):
        tally.record("bundle manifest (fields)", "not JSON")
        return
    outcome = _outcome(bundle, valid)
    outcome.record(tally, "bundle manifest (fields)")
    refusal = outcome.checked
    if refusal is None:
        return
    assert "member '" in refusal, refusal
    named = re.search(r"field '([^']*)'", refusal)
    if named is None or any(not e.path for e in edits):
        return
    field = named.group(1)
    touched = [f for e in edits for f in e.fields]
    assert any(field == f or field.startswith(f"{f}.") or f.startswith(f"{field}.")
               or field.split(".")[0] in CROSS.get(f.split(".")[0], ())
               or field == "(top level)" for f in touched), (refusal, touched)


NAMES = st.sampled_from([
    "../escape.txt", "/etc/passwd", "a/../../escape", "C:evil", "dir/./x", "dir//x", "x\\y",
    "policy.onnx/inner", "new\nline", MANIFEST_NAME, "policy.onnx", "ok/nested.bin", ".hidden",
    "é-unicode", "a" * 200,
])
KINDS = st.sampled_from([tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE,
                         tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.CONTTYPE, b"x"])


@st.composite
def hostile(draw: st.DrawFn, valid: bytes) -> tuple[Blob, str]:
    """``valid`` with members renamed, retyped, duplicated, dropped, reordered or added, its
    manifest listing the new payload (or not); returns the tar and what was done. What was
    done starts with ``must refuse`` when a member left in the tar is not a plain file under a
    safe name, which every check must refuse."""
    members: list[Member] = [(_info(n, len(d)), d) for n, d in _members(valid)]
    done = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["rename", "retype", "duplicate", "drop", "move", "add"]))
        i = draw(st.integers(0, len(members) - 1)) if members else 0
        if not members and op != "add":
            continue
        done.append(f"{op} {members[i][0].name if members else ''}")
        if op == "rename":
            members[i][0].name = draw(NAMES)
        elif op == "retype":
            kind = draw(KINDS)
            info = _info(members[i][0].name, 0, kind)
            info.linkname = draw(st.sampled_from(["/etc/passwd", "../x", "policy.onnx"]))
            members[i] = (info, None if kind != tarfile.CONTTYPE else b"")
        elif op == "duplicate":
            members.insert(draw(st.integers(0, len(members))), copy.deepcopy(members[i]))
        elif op == "drop":
            del members[i]
        elif op == "move":
            members.insert(draw(st.integers(0, len(members) - 1)), members.pop(i))
        else:
            body = draw(st.binary(max_size=64))
            members.insert(draw(st.integers(0, len(members))), (_info(draw(NAMES), len(body)),
                                                                 body))
    first = members[0] if members else None
    if draw(st.booleans()) and first and first[0].name == MANIFEST_NAME and first[1] == (
            valid_manifest := _members(valid)[0][1]):
        manifest = json.loads(valid_manifest)
        manifest["files"] = {
            info.name: {"sha256": hashlib.sha256(body or b"").hexdigest(),
                        "bytes": len(body or b"")}
            for info, body in members[1:] if info.name != MANIFEST_NAME}
        text = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        members[0] = (_info(MANIFEST_NAME, len(text)), text)
        done.append("manifest relisted")
    data = _tar(members)
    try:
        written = _listing(data)  # what tarfile wrote, which may differ from what was asked
    except tarfile.ReadError:
        written = [("(unreadable)", b"?", 0)]
    unsafe = [name for name, kind, _ in written
              if kind not in (tarfile.REGTYPE, tarfile.AREGTYPE) or name in UNSAFE_NAMES]
    names = [name for name, _, _ in written]
    under_a_file = [n for n in names if any(n.startswith(f"{other}/") for other in names)]
    if unsafe or under_a_file or len(set(names)) < len(names):
        done.insert(0, "must refuse")
    return Blob(data), "; ".join(done)


def _listing(data: bytes) -> list[tuple[str, bytes, int]]:
    """(name, type, size) of every member of a tar."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, m.type, m.size) for m in tar.getmembers()]


UNSAFE_NAMES = {"../escape.txt", "/etc/passwd", "a/../../escape", "C:evil", "new\nline"}
"""Member names that reach outside the bundle's folder, name a drive or hold a line break."""


@examples(200)
@given(data=st.data())
def test_hostile_members_are_refused_and_nothing_escapes(
    valid: bytes, data: st.DataObject, tally: Tally
) -> None:
    bundle, done = data.draw(hostile(valid), label="members")
    outcome = _outcome(bundle, None)
    outcome.record(tally, "bundle members")
    if done.startswith("must refuse"):
        assert outcome.verified is not None, f"verify accepted: {done}"
        assert outcome.loaded is not None, f"the runtime ran: {done}"


def test_cli_verify_refuses_corrupt_bundles_in_one_line_with_status_two(
    valid: bytes, tmp_path: Path
) -> None:
    flipped = bytearray(valid)
    flipped[len(valid) // 2] ^= 0x55
    escaping = _tar([(_info(MANIFEST_NAME, 2), b"{}"), (_info("../escape", 1), b"x")])
    for name, data in (("flipped.tar", bytes(flipped)), ("escaping.tar", escaping)):
        path = tmp_path / name
        path.write_bytes(data)
        before = listing(tmp_path)
        done = subprocess.run([sys.executable, "-m", "flows.cli", "bundle", "verify", str(path)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"flows: error: {path}: ") and done.stderr.count("\n") == 1
        assert listing(tmp_path) == before


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path]:
    """A signed bundle's bytes and the public key of its signer."""
    pytest.importorskip("model_signing")
    from edge.calibration import draw_calibration_set
    from edge.export import export_onnx
    from edge.pack import pack_policy_bundle
    from edge.targets import get_target

    folder = tmp_path_factory.mktemp("signed")
    private, public = keypair(folder)
    policy = _Policy()
    obs = np.random.default_rng(0).standard_normal((64, OBS_DIM)).astype(np.float32)
    onnx_path = export_onnx(policy, OBS_DIM, folder / "policy.onnx")
    out = folder / "signed.tar"
    pack_policy_bundle(out, onnx_path, draw_calibration_set(obs, 32), "dataset observations",
                       _manifest_fields(policy.state_dict()), get_target("jetson-agx-orin"),
                       signing_key=private)
    return out.read_bytes(), public


@examples(120)
@given(data=st.data())
def test_corrupted_signed_bundles_run_only_as_signed(
    signed: tuple[bytes, Path], data: st.DataObject, tally: Tally
) -> None:
    """A signed bundle with its bytes edited either is refused with the signer's key (one
    line, nothing left in the work folder) or runs with exactly the content that was signed."""
    valid, public = signed
    corrupted = data.draw(text_edits(Blob(valid)), label="bytes")
    folder = Path(tempfile.mkdtemp(prefix="physai-fuzz-signed-"))
    try:
        path, work = folder / "policy.bundle.tar", folder / "run"
        path.write_bytes(corrupted)
        try:
            load_bundle(path, work, providers=["CPUExecutionProvider"], trust_key=public)
        except RuntimeRefusal as exc:
            check_one_line(str(exc), path)
            assert not any(work.iterdir()), "the runtime left files behind"
            tally.record("signed bundle (bytes)", "refused")
            return
        original = dict(_members(valid))
        got = {p.relative_to(work).as_posix(): p.read_bytes()
               for p in work.rglob("*") if p.is_file()}
        assert got == {n: d for n, d in original.items() if n != "bundle.sig"}, "not as signed"
        tally.record("signed bundle (bytes)", "ran as signed")
    finally:
        for item in sorted(folder.rglob("*"), reverse=True):
            item.rmdir() if item.is_dir() else item.unlink()
        folder.rmdir()
