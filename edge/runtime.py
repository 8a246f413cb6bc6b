"""On-robot runtime: load and verify a policy bundle, then run it in a fixed-rate control loop.

This module is copied to the robot alone, so it imports only the standard library, numpy and,
inside functions, ``onnxruntime``, ``tensorrt`` or ``model-signing``; nothing from the project.

- :func:`read_bundle` reads a bundle tar once into memory and checks it whole before anything
  is written: ``manifest.json`` first, every member a plain regular file (no link, device or
  sparse member of any tar format) of a safe name, listed in the manifest with its size and
  sha256, within a per-member and a total cap. Refusals are one line (:class:`RuntimeRefusal`)
  naming the bundle and the member.
- :func:`authenticate` runs a bundle only when its signature (``bundle.sig``, OpenSSF
  model-signing, elliptic-curve key) verifies with the trust key over exactly the digests
  just computed, or when the caller says ``allow_unsigned`` (a warning line each time).
  :func:`load_bundle` does both, then extracts and opens the policy.
- The execution provider is TensorRT when ONNX Runtime offers it, then CUDA, then CPU
  (:func:`choose_providers`); its engine cache lives outside the bundle's folder.
  :class:`TensorRTPolicy` is the separate path for an engine built on the target
  (``engine.py``): loaded only when its sha256 is the one the engine report of this very
  bundle records, it has the same ``infer`` as the ONNX Runtime policy, on a TensorRT
  execution context with device buffers from ``cuda-python``.
- :class:`ControlLoop` runs ``read -> infer -> apply`` on an absolute ``perf_counter_ns``
  grid; for a policy that sees, each step also takes the frames of a camera callable and
  passes them to the policy by name. A bundle whose manifest has ``io.chunk`` holds a policy
  that emits chunks of actions; the loop queries it only when a chunk is due
  (:class:`ActionChunks`) and counts the queries. A bundle whose manifest has ``io.diffusion``
  holds a diffusion policy: :class:`DiffusionSampler` keeps its last ``n_obs_steps``
  observations, draws its noise from the seeded generator the manifest names and feeds the
  scheduler's steps (:func:`diffusion_schedule`) to its graph. A malformed observation or
  frame (wrong type, dtype or shape, NaN or inf) or an inference that ends after the step's
  deadline makes the step apply the safe action instead, and is counted.

On the robot: ``python3 runtime.py BUNDLE.tar --trust KEY.pub --workdir DIR`` checks, extracts
and opens a bundle and prints its I/O contract (:func:`main`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import numpy as np

MANIFEST_NAME = "manifest.json"
"""Name of the manifest member, always the first member of a bundle."""
FORMAT_VERSION = 1
"""The bundle layout this runtime reads and :mod:`edge.bundle` writes."""
MODEL_NAME = "policy.onnx"
INPUT_NAME = "obs"
"""The state input of every policy. Shape: (batch, obs_dim), float32."""
OUTPUT_NAME = "actions"
IMAGE_SUFFIX = "_image"
"""Ending of a camera image input's name, ``<camera>_image``. Shape: (batch, H, W, 3), uint8,
RGB, HWC; the manifest's ``io.images`` lists each with its camera."""
MAX_MEMBER_BYTES = 1 << 30
"""Default cap on one member's size (1 GiB)."""
MAX_MANIFEST_BYTES = 16 << 20
"""Cap on the manifest member's size (16 MiB)."""
MAX_TOTAL_BYTES = 1 << 30
"""Default cap on the summed size of a bundle's members, manifest included (1 GiB)."""
MAX_TOTAL_BYTES_VAR = "PHYSAI_BUNDLE_MAX_BYTES"
"""Environment variable that overrides :data:`MAX_TOTAL_BYTES` (a whole number of bytes)."""
TAR_OVERHEAD_BYTES = 16 << 20
"""Room for tar headers and padding: a bundle file may exceed its members' cap by this much
and the signature cap, no more (16 MiB)."""
ENGINE_CACHE_VAR = "PHYSAI_TRT_CACHE"
"""Environment variable naming the folder of ONNX Runtime's TensorRT engine cache."""
REPORT_NAME = "engine_report.json"
"""The report an engine build writes beside the engine (:mod:`edge.engine`)."""
SIGNATURE_NAME = "bundle.sig"
"""The signature member of a signed bundle: the last member, not listed in the manifest (it
signs the manifest and every listed member, in the OpenSSF model-signing format)."""
MAX_SIGNATURE_BYTES = 1 << 20
"""Cap on the signature member's size (1 MiB)."""
MAX_CHUNK_SIZE = 1_024
"""Most actions in one chunk (:class:`ActionChunks`, a manifest's ``io.chunk.size``, a LeRobot
policy's ``chunk_size``, a policy server's): ten times ACT's default of 100, twenty times pi0's
50. Each world's chunks take ``16 * size`` bytes of bookkeeping and ``8 * size * act_dim`` of
actions."""
MAX_VECTOR_WIDTH = 65_536
"""Most entries of a policy's observation or action vector (a manifest's ``io.obs`` and
``io.actions`` shapes): far above any robot's joints and sensors."""
MAX_IMAGE_SIDE = 4_096
"""Most pixels on either side of a camera image a policy reads (a manifest's ``io.images``, a
policy server's ``image_shapes``): a 4096 x 4096 RGB frame is 48 MiB."""
PROVIDER_ORDER = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
"""Execution providers in order of preference; CPU is always the last resort."""

REGULAR_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)
"""Tar member types of a regular file, as :mod:`edge.bundle` writes and accepts them."""
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
_HEX = frozenset("0123456789abcdef")

_SPIN_NS = 300_000
"""The loop sleeps until this close to a slot boundary, then spins (sleep overshoots ~60 us)."""


class RuntimeRefusal(Exception):
    """A bundle or engine the runtime will not run; the message is one line."""


def _refuse(bundle: Path, member: str, problem: str) -> RuntimeRefusal:
    where = f"{bundle}: member {member!r}" if member else str(bundle)
    return RuntimeRefusal(" ".join(f"{where}: {problem}".split()))


# --------------------------------------------------------------------------- bundle reading


@dataclass(frozen=True)
class BundleBytes:
    """A bundle file read once into memory and checked whole: every member against the
    manifest, the caps, the tar types. Nothing of it has been written anywhere yet; the
    members are views into :attr:`data`, the very bytes that were hashed."""

    path: Path
    data: bytes
    """The bundle file's bytes, as read (once)."""
    sha256: str
    """Hex sha256 of :attr:`data`: the bundle's digest."""
    manifest: dict[str, Any]
    members: dict[str, memoryview]
    """Member name -> its bytes, ``manifest.json`` first, then the listed members; never the
    signature."""
    digests: dict[str, str]
    """Member name -> hex sha256 of its bytes (the manifest's own included)."""
    signature: bytes | None
    """The ``bundle.sig`` member's bytes; None for an unsigned bundle."""


def total_cap(value: int | None = None) -> int:
    """The cap on a bundle's summed member sizes: ``value`` when given, else the environment
    variable :data:`MAX_TOTAL_BYTES_VAR`, else :data:`MAX_TOTAL_BYTES`."""
    if value is not None:
        cap = value
    else:
        raw = os.environ.get(MAX_TOTAL_BYTES_VAR, "").strip()
        if not raw:
            return MAX_TOTAL_BYTES
        try:
            cap = int(raw)
        except ValueError:
            cap = 0
        if cap < 1:
            raise RuntimeRefusal(f"environment variable {MAX_TOTAL_BYTES_VAR}: must be a "
                                 f"positive whole number of bytes (value: {raw[:40]!r})")
    if type(cap) is not int or cap < 1:
        raise RuntimeRefusal(f"max_total_bytes must be a positive whole number (value: {cap!r})")
    return cap


def read_bundle(
    path: Path, *, max_member_bytes: int = MAX_MEMBER_BYTES, max_total_bytes: int | None = None
) -> BundleBytes:
    """Read the bundle file at ``path`` once and check it whole, writing nothing.

    Refused with a one-line :class:`RuntimeRefusal` naming the bundle and the member: a file
    over the size cap; a manifest that is not the first member or not a JSON object of
    format 1 mapping safe member names to their ``bytes`` and ``sha256``; an unsafe name; a
    member that is not a regular file, or is sparse (in any tar format); a duplicate, unlisted
    or missing member; a member over ``max_member_bytes``; members whose sizes sum over
    ``max_total_bytes`` (see :func:`total_cap`); a size or sha256 that differs from the
    manifest's; anything after the signature member. The signature is not checked here (see
    :func:`authenticate`).
    """
    path = Path(path)
    cap = total_cap(max_total_bytes)
    limit = cap + MAX_SIGNATURE_BYTES + TAR_OVERHEAD_BYTES
    if not path.is_file():
        raise _refuse(path, "", "bundle file not found")
    try:
        with path.open("rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            if size > limit:
                raise _refuse(path, "", f"{size} bytes exceeds the bundle file cap {limit} "
                                        f"(members {cap}, {MAX_TOTAL_BYTES_VAR})")
            data = stream.read(limit + 1)
    except OSError as exc:
        raise _refuse(path, "", f"cannot read the bundle file: {exc}") from exc
    if len(data) > limit:
        raise _refuse(path, "", f"more than {limit} bytes: exceeds the bundle file cap")
    opened = False
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            opened = True
            return _scan(path, tar, data, max_member_bytes, cap)
    except (tarfile.TarError, EOFError) as exc:
        what = "corrupt tar archive" if opened else "not an uncompressed tar archive"
        raise _refuse(path, "", f"{what}: {exc}") from exc


def _scan(path: Path, tar: tarfile.TarFile, data: bytes, max_member_bytes: int, cap: int
          ) -> BundleBytes:
    """Check every member of ``tar`` (read from ``data``) against the manifest."""
    view = memoryview(data)
    first = tar.next()
    if first is None:
        raise _refuse(path, MANIFEST_NAME, "missing (the archive is empty)")
    if first.name != MANIFEST_NAME:
        raise _refuse(path, first.name, f"first member must be {MANIFEST_NAME!r}")
    _check_type(path, first)
    if first.size > MAX_MANIFEST_BYTES:
        raise _refuse(path, MANIFEST_NAME, f"{first.size} bytes exceeds {MAX_MANIFEST_BYTES}")
    raw = _member_bytes(path, first, view)
    try:
        parsed = strict_json(bytes(raw))
    except ValueError as exc:  # UnicodeDecodeError included
        raise _refuse(path, MANIFEST_NAME, f"invalid JSON: {exc}") from exc
    manifest = check_manifest_fields(path, parsed)
    listed: dict[str, dict[str, Any]] = manifest["files"]
    total = len(raw)
    if total > min(max_member_bytes, cap):
        raise _refuse(path, MANIFEST_NAME, f"{total} bytes exceeds the cap "
                                           f"{min(max_member_bytes, cap)}")
    members = {MANIFEST_NAME: raw}
    digests = {MANIFEST_NAME: sha256(raw).hexdigest()}
    signature: bytes | None = None
    while (member := tar.next()) is not None:
        name = member.name
        if signature is not None:
            raise _refuse(path, name, f"follows {SIGNATURE_NAME}, which must be the last member")
        if name == SIGNATURE_NAME and name not in listed:
            _check_type(path, member)
            if member.size > MAX_SIGNATURE_BYTES:
                raise _refuse(path, name, f"{member.size} bytes exceeds the signature cap "
                                          f"{MAX_SIGNATURE_BYTES}")
            signature = bytes(_member_bytes(path, member, view))
            continue
        if name in members:
            raise _refuse(path, name, "duplicate member")
        problem = member_name_problem(name)
        if problem:
            raise _refuse(path, name, problem)
        _check_type(path, member)
        entry = listed.get(name)
        if entry is None:
            raise _refuse(path, name, "not listed in the manifest")
        if member.size > max_member_bytes:
            raise _refuse(path, name, f"{member.size} bytes exceeds the member cap "
                                      f"{max_member_bytes}")
        total += member.size
        if total > cap:
            raise _refuse(path, name, f"bundle total {total} bytes exceeds the cap {cap}")
        if member.size != entry["bytes"]:
            raise _refuse(path, name, f"size {member.size} differs from the manifest's "
                                      f"{entry['bytes']}")
        chunk = _member_bytes(path, member, view)
        digest = sha256(chunk).hexdigest()
        if digest != entry["sha256"]:
            raise _refuse(path, name, f"sha256 {digest} differs from the manifest's "
                                      f"{entry['sha256']}")
        members[name], digests[name] = chunk, digest
    missing = sorted(set(listed) - set(members))
    if missing:
        raise _refuse(path, missing[0], "listed in the manifest but missing from the archive")
    return BundleBytes(path=path, data=data, sha256=sha256(data).hexdigest(), manifest=manifest,
                       members=members, digests=digests, signature=signature)


def _check_type(path: Path, member: tarfile.TarInfo) -> None:
    """Refuse anything but a plain regular file: links, devices, folders, and sparse files of
    every tar format (old GNU ``S`` members and PAX ``GNU.sparse.*`` headers, whose few stored
    bytes would expand to the size they declare)."""
    if member.type not in REGULAR_TYPES:
        kind = _KINDS.get(member.type, f"tar type {member.type!r}")
        raise _refuse(path, member.name, f"not a regular file ({kind})")
    sparse = sorted(k for k in member.pax_headers if k.startswith("GNU.sparse."))
    if getattr(member, "sparse", None) is not None or sparse:
        how = f"PAX header {sparse[0]}" if sparse else "sparse map"
        raise _refuse(path, member.name, f"sparse file ({how}, declaring {member.size} bytes); "
                                         "bundles hold plain regular files only")


def _member_bytes(path: Path, member: tarfile.TarInfo, view: memoryview) -> memoryview:
    """The stored bytes of a plain regular member, a view into the bundle's bytes."""
    start = member.offset_data
    end = start + member.size
    if end > len(view):
        raise _refuse(path, member.name, f"truncated: {member.size} bytes declared, "
                                         f"{max(len(view) - start, 0)} stored")
    return view[start:end]


def check_manifest_fields(path: Path, manifest: object) -> dict[str, Any]:
    """Check the manifest fields the bundle format owns: ``format_version`` and the ``files``
    map of safe member names to exactly ``bytes`` (an integer >= 0) and ``sha256`` (64
    lowercase hex digits), no name both a file and a folder of others."""
    if not isinstance(manifest, dict):
        raise _refuse(path, MANIFEST_NAME, f"must be a JSON object (value: "
                                           f"{type(manifest).__name__})")
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise _refuse(path, MANIFEST_NAME, f"field 'format_version' must be {FORMAT_VERSION} "
                                           f"(value: {version!r})")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise _refuse(path, MANIFEST_NAME, f"field 'files' must be an object (value: "
                                           f"{str(files)[:80]!r})")
    for name, entry in files.items():
        field = f"field 'files.{name}'"
        problem = member_name_problem(name)
        if problem:
            raise _refuse(path, MANIFEST_NAME, f"{field}: {problem}")
        if not isinstance(entry, dict) or sorted(entry) != ["bytes", "sha256"]:
            raise _refuse(path, MANIFEST_NAME, f"{field} must hold exactly 'bytes' and 'sha256'")
        digest, size = entry["sha256"], entry["bytes"]
        if not is_sha256(digest):
            raise _refuse(path, MANIFEST_NAME, f"{field}.sha256 must be 64 lowercase hex digits "
                                               f"(value: {str(digest)[:80]!r})")
        if type(size) is not int or size < 0:
            raise _refuse(path, MANIFEST_NAME, f"{field}.bytes must be an integer >= 0 "
                                               f"(value: {size!r})")
    conflict = path_conflict(files)
    if conflict:
        raise _refuse(path, MANIFEST_NAME, f"field 'files.{conflict}' is both a file and a folder")
    return manifest


def is_sha256(value: object) -> bool:
    """Whether ``value`` is a hex sha256 digest: exactly 64 lowercase hex digits."""
    return isinstance(value, str) and len(value) == 64 and all(c in _HEX for c in value)


def path_conflict(names: Iterable[str]) -> str | None:
    """A member name that is also a parent folder of another member, or None."""
    names = set(names)
    folders = {str(parent) for name in names for parent in PurePosixPath(name).parents}
    clashes = sorted(folders.intersection(names))
    return clashes[0] if clashes else None


# --------------------------------------------------------------------------- signatures


def authenticate(bundle: BundleBytes, trust_key: Path | None, allow_unsigned: bool) -> str:
    """Refuse ``bundle`` unless ``trust_key`` (a PEM public key file) verifies its signature
    over exactly its content, or ``allow_unsigned`` says to run it unauthenticated (then a
    one-line warning goes to standard error). Returns a line saying what vouches for it."""
    if trust_key is not None:
        check_signature(bundle, Path(trust_key))
        return f"signed with the key of {trust_key} over exactly this content"
    state = "unsigned" if bundle.signature is None else "signed, but no trust key was given"
    if not allow_unsigned:
        raise _refuse(bundle.path, "", f"{state}: nothing vouches for its code and model; pass "
                                       "the signer's public key (--trust KEY, trust_key=) or "
                                       "run it unauthenticated (--allow-unsigned, "
                                       "allow_unsigned=True)")
    warning = f"warning: {bundle.path}: {state}; running it unauthenticated (allow_unsigned)"
    print(" ".join(warning.split()), file=sys.stderr, flush=True)
    return f"NOT authenticated ({state}; allowed unsigned)"


def check_signature(bundle: BundleBytes, trust_key: Path) -> None:
    """Refuse unless the bundle's signature was made with the private key of ``trust_key``
    over exactly its manifest and listed members (the digests already computed from the
    bytes read). Uses the ``model-signing`` package's key verifier (imported only here)."""
    path = bundle.path
    if bundle.signature is None:
        raise _refuse(path, SIGNATURE_NAME, f"missing: the bundle is unsigned and a trust key "
                                            f"was given ({trust_key}); to run it anyway, "
                                            f"--allow-unsigned")
    if not trust_key.is_file():
        raise _refuse(path, "", f"trust key file not found: {trust_key}")
    try:
        from model_signing._signing import sign_ec_key, sign_sigstore_pb
    except ImportError as exc:
        raise _refuse(path, SIGNATURE_NAME, f"cannot check the signature: the model-signing "
                                            f"package is not importable ({exc}); install it "
                                            "with: pip install model-signing") from exc
    try:
        verifier = sign_ec_key.Verifier(trust_key)
    except Exception as exc:  # cryptography's parsers raise ValueError and their own errors
        raise _refuse(path, "", f"trust key {trust_key} is not a PEM elliptic-curve public key "
                                f"({type(exc).__name__})") from None
    with tempfile.TemporaryDirectory(prefix="physai-signature-") as scratch:
        sig = Path(scratch) / SIGNATURE_NAME
        sig.write_bytes(bundle.signature)
        try:
            signed = verifier.verify(sign_sigstore_pb.Signature.read(sig))
        except Exception as exc:  # model-signing raises ValueError and its parsers' errors
            raise _refuse(path, SIGNATURE_NAME, signature_problem(exc, trust_key)) from None
    method = signed.serialization_type
    if (method.get("method"), method.get("hash_type")) != ("files", "sha256"):
        raise _refuse(path, SIGNATURE_NAME, f"signs a {method.get('method')!r} serialization "
                                            f"with {method.get('hash_type')!r}; bundles are "
                                            "signed file by file with sha256")
    expected = {str(rd.identifier): rd.digest for rd in signed.resource_descriptors()}
    for name in sorted(set(expected) | set(bundle.digests)):
        if name not in expected:
            raise _refuse(path, SIGNATURE_NAME, f"content is not in what was signed ({name})")
        if name not in bundle.digests:
            raise _refuse(path, SIGNATURE_NAME, f"content is missing from what was signed "
                                                f"({name})")
        digest = expected[name]
        if digest.algorithm != "sha256" or digest.digest_hex != bundle.digests[name]:
            raise _refuse(path, SIGNATURE_NAME, f"content differs from what was signed ({name})")


def signature_problem(exc: BaseException, trust_key: Path) -> str:
    """One line saying why model-signing refused a signature, without bytes or digests."""
    text = str(exc).replace("\\'", "'").replace('"', "'")
    if "Key mismatch" in text or type(exc).__name__ == "InvalidSignature":
        return f"signed by another key than the trusted one ({trust_key})"
    first = text.strip().splitlines()[0][:200] if text.strip() else type(exc).__name__
    return f"signature does not verify with {trust_key}: {first}"


def write_members(bundle: BundleBytes, folder: Path) -> None:
    """Write the checked bundle's manifest and members into ``folder`` (which must exist and
    hold none of their names); the signature member is not written."""
    for name, chunk in bundle.members.items():
        target = folder.joinpath(*name.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("xb") as out:
            out.write(chunk)


def member_name_problem(name: object) -> str | None:
    """Why ``name`` is not a safe relative member path of a bundle's payload, or None."""
    if not isinstance(name, str) or not name:
        return "name must be a non-empty string"
    if name == MANIFEST_NAME:
        return "name is reserved for the manifest"
    if name.startswith("/") or name[1:2] == ":":
        return "absolute path (or a drive letter)"
    if any(ord(char) < 0x20 or char == "\\" for char in name):
        return "control character or backslash in name"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "empty, '.' or '..' path component"
    return None


def strict_json(raw: bytes) -> object:
    """Parse UTF-8 JSON that holds no repeated key and no NaN or infinity (canonical JSON never
    does); anything else raises ValueError naming what was wrong."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise ValueError(f"duplicate key {key!r}")
            result[key] = value
        return result

    def finite(token: str) -> None:
        raise ValueError(f"non-finite number {token}")

    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=unique, parse_constant=finite)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_at_most(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, reading no more than ``limit`` + 1 of them; a larger file raises
    ValueError (and a missing one FileNotFoundError)."""
    with open(path, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit:,} bytes")
    return data


# --------------------------------------------------------------------------- bundle loading


@dataclass(frozen=True)
class LoadedPolicy:
    """A verified bundle's ONNX Runtime session with its I/O sizes and action range."""

    bundle: Path
    workdir: Path
    manifest: dict[str, Any]
    session: Any
    """An ``onnxruntime.InferenceSession`` (or anything with its ``run`` method)."""
    provider: str
    """The execution provider ONNX Runtime actually put first."""
    obs_dim: int
    act_dim: int
    action_low: np.ndarray
    action_high: np.ndarray
    control_hz: float
    manifest_sha256: str = ""
    """Hex sha256 of the bundle's ``manifest.json``: what an engine report names the bundle by."""
    images: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Image input name -> one frame's shape (height, width, 3), uint8 RGB HWC, as the
    manifest's ``io.images`` lists them; empty for a state policy."""
    chunk: dict[str, Any] | None = None
    """The manifest's ``io.chunk`` for a policy that emits chunks of actions (its ``size`` k
    and how they run, :class:`ActionChunks`); None for one action a query."""
    diffusion: DiffusionSampler | None = None
    """A diffusion policy's sampler (the manifest's ``io.diffusion``): its history, noise and
    schedule; None for any other policy."""

    @property
    def action_shape(self) -> tuple[int, ...]:
        """One query's actions: (act_dim,), or (k, act_dim) for chunks of k actions."""
        return (self.act_dim,) if self.chunk is None else (int(self.chunk["size"]), self.act_dim)

    def infer(self, obs: np.ndarray, images: Mapping[str, np.ndarray] | None = None
              ) -> np.ndarray:
        """Actions for one observation and, for a policy that sees, one frame of each of its
        image inputs by name. Shape: (obs_dim,) float32 [+ (H, W, 3) uint8 each] -> (act_dim,),
        or a chunk (k, act_dim) for a policy that emits chunks (:attr:`chunk`).
        """
        feed = self._feed(obs, images)
        if self.diffusion is not None:
            return self.diffusion(feed).reshape(self.action_shape)
        out = self.session.run([OUTPUT_NAME], feed)[0]
        return np.asarray(out).reshape(self.action_shape)

    def _feed(self, obs: np.ndarray, images: Mapping[str, np.ndarray] | None
              ) -> dict[str, np.ndarray]:
        """One observation and its frames by input name, each with a batch of 1."""
        feed: dict[str, np.ndarray] = {INPUT_NAME: obs.reshape(1, self.obs_dim)}
        if self.images:
            frames = images if images is not None else {}
            missing = [name for name in self.images if name not in frames]
            if missing:
                raise ValueError(f"the policy reads camera images {list(self.images)}; "
                                 f"missing: {missing}")
            for name, shape in self.images.items():
                feed[name] = frames[name].reshape(1, *shape)
        return feed

    def observe(self, obs: np.ndarray, images: Mapping[str, np.ndarray] | None = None
                ) -> None:
        """Keep a step's observation in a diffusion policy's history on a step that acts from
        a chunk already given (:class:`ControlLoop` calls it); nothing for other policies."""
        if self.diffusion is not None:
            self.diffusion.observe(self._feed(obs, images))

    def reset(self) -> None:
        """Forget a diffusion policy's history: its next observation fills it (a new episode,
        or after a safe hold); nothing for other policies."""
        if self.diffusion is not None:
            self.diffusion.reset()


def load_bundle(
    path: Path,
    workdir: Path,
    *,
    providers: list[str] | None = None,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_total_bytes: int | None = None,
    trust_key: Path | None = None,
    allow_unsigned: bool = False,
    engine_cache: Path | None = None,
) -> LoadedPolicy:
    """Read the bundle at ``path`` once, check it whole, then extract it into ``workdir`` and
    open its policy.

    The bundle must be signed, over exactly its content, with the private key of
    ``trust_key`` (a PEM public key file); without one it is refused unless
    ``allow_unsigned`` (a warning line then goes to standard error). Every check of
    :func:`read_bundle` and the signature's run on the bytes read before anything is written.
    ``workdir`` is created when missing and must be empty; on refusal nothing is left in it.
    ``providers`` overrides :func:`choose_providers` (e.g. ``["CPUExecutionProvider"]``);
    TensorRT's engine cache lives in ``engine_cache`` (default :func:`default_engine_cache`),
    never in ``workdir``. Raises :class:`RuntimeRefusal`.
    """
    path, workdir = Path(path), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if any(workdir.iterdir()):
        raise _refuse(path, "", f"work folder is not empty: {workdir}")
    bundle = read_bundle(path, max_member_bytes=max_member_bytes,
                         max_total_bytes=max_total_bytes)
    authenticate(bundle, trust_key, allow_unsigned)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=workdir))
    try:
        write_members(bundle, staging)
        for item in staging.iterdir():
            item.rename(workdir / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    cache = Path(engine_cache) if engine_cache is not None else default_engine_cache()
    try:
        return _open_policy(path, workdir, bundle, providers, cache)
    except RuntimeRefusal:
        for item in workdir.iterdir():
            shutil.rmtree(item) if item.is_dir() else item.unlink()
        raise


def default_engine_cache() -> Path:
    """Where ONNX Runtime's TensorRT provider caches engines: :data:`ENGINE_CACHE_VAR`, else
    ``$XDG_CACHE_HOME/physai-runtime/tensorrt`` (``~/.cache`` when unset); outside every
    bundle's folder, so no bundle member can stand in for a cached engine."""
    named = os.environ.get(ENGINE_CACHE_VAR, "").strip()
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "physai-runtime" / "tensorrt"


def _open_policy(
    bundle: Path, workdir: Path, read: BundleBytes, providers: list[str] | None, cache: Path
) -> LoadedPolicy:
    """Read the I/O contract from the manifest and open the ONNX model on it."""
    manifest = read.manifest
    try:
        spec = manifest["io"]
        obs_dim = int(spec["obs"]["shape"][-1])
        act_dim = int(spec["actions"]["shape"][-1])
        low, high = spec["actions"].get("range", [-1.0, 1.0])
        control_hz = float(manifest["control_hz"])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        problem = f"bad or missing io/control_hz field: {exc!r}"
        raise _refuse(bundle, MANIFEST_NAME, problem) from exc
    if not 0 < control_hz < float("inf"):
        raise _refuse(bundle, MANIFEST_NAME, f"control_hz must be above 0 (value: {control_hz})")
    for name, width in (("io.obs.shape", obs_dim), ("io.actions.shape", act_dim)):
        if not 1 <= width <= MAX_VECTOR_WIDTH:
            raise _refuse(bundle, MANIFEST_NAME, f"field {name!r} must end in 1 .. "
                                                 f"{MAX_VECTOR_WIDTH:,} entries (value: {width:,})")
    images = manifest_images(bundle, manifest)
    chunk = manifest_chunk(bundle, manifest)
    diffusion = manifest_diffusion(bundle, manifest, chunk)
    if MODEL_NAME not in manifest["files"]:
        raise _refuse(bundle, MODEL_NAME, "missing from the bundle")
    try:
        session, provider = open_onnx_session(workdir / MODEL_NAME, providers, cache_dir=cache)
    except RuntimeRefusal as exc:
        raise _refuse(bundle, MODEL_NAME, f"ONNX Runtime cannot load it: {exc.__cause__}") from exc
    _check_graph(bundle, session, obs_dim, act_dim, images, diffusion)
    _check_chunk(bundle, session, chunk)
    try:
        action_low = np.broadcast_to(np.asarray(low, np.float32), (act_dim,)).copy()
        action_high = np.broadcast_to(np.asarray(high, np.float32), (act_dim,)).copy()
    except (TypeError, ValueError) as exc:
        raise _refuse(bundle, MANIFEST_NAME, f"bad io.actions.range: {exc!r}") from exc
    if not (np.isfinite(action_low).all() and np.isfinite(action_high).all()
            and (action_low <= action_high).all()):
        raise _refuse(bundle, MANIFEST_NAME, f"io.actions.range must be finite, low <= high "
                                             f"(value: {[low, high]!r})")
    return LoadedPolicy(
        bundle=bundle,
        workdir=workdir,
        manifest=manifest,
        session=session,
        provider=provider,
        obs_dim=obs_dim,
        act_dim=act_dim,
        action_low=action_low,
        action_high=action_high,
        control_hz=control_hz,
        manifest_sha256=read.digests[MANIFEST_NAME],
        images=images,
        chunk=chunk,
        diffusion=None if diffusion is None else DiffusionSampler(
            lambda feed: session.run([OUTPUT_NAME], feed)[0], diffusion, act_dim),
    )


def manifest_diffusion(bundle: Path, manifest: Mapping[str, Any],
                       chunk: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The manifest's ``io.diffusion`` (:data:`DIFFUSION_KEY`), checked to run
    (:func:`diffusion_problem`), its chunks of ``n_action_steps`` run one by one
    (``io.chunk`` ``{size: n_action_steps, execute: n <= size}``); None when absent."""
    spec = manifest["io"].get(DIFFUSION_KEY)
    if spec is None:
        return None
    problem = diffusion_problem(spec)
    if problem:
        raise _refuse(bundle, MANIFEST_NAME, f"field 'io.{DIFFUSION_KEY}': {problem}")
    if chunk is None or chunk["size"] != spec["n_action_steps"] or "execute" not in chunk:
        raise _refuse(bundle, MANIFEST_NAME, f"field 'io.{CHUNK_KEY}' must be {{size: "
                                             f"{spec['n_action_steps']}, execute: n}} for a "
                                             f"diffusion policy (value: {chunk!r})")
    return dict(spec)


def manifest_chunk(bundle: Path, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The manifest's ``io.chunk`` (:data:`CHUNK_KEY`), checked to run (:class:`ActionChunks`):
    ``size`` k and ``execute`` n <= k or ``ensemble`` m >= 0; None when absent, and then the
    actions must be ``["batch", act_dim]``."""
    spec = manifest["io"].get(CHUNK_KEY)
    shape = manifest["io"]["actions"].get("shape")
    if spec is None:
        if isinstance(shape, list) and len(shape) != 2:
            raise _refuse(bundle, MANIFEST_NAME, f"field 'io.actions.shape' is a chunk of "
                                                 f"actions; it needs field 'io.{CHUNK_KEY}' "
                                                 f"(value: {shape!r})")
        return None
    try:
        if not isinstance(spec, dict) or not set(spec) < {"size", "execute", "ensemble"} or \
                any(type(v) not in (int, float) for v in spec.values()) or \
                type(spec.get("size")) is not int or type(spec.get("execute", 1)) is not int:
            raise ValueError("must be {size, execute} or {size, ensemble}, numbers")
        ActionChunks.from_spec(spec)
    except ValueError as exc:
        raise _refuse(bundle, MANIFEST_NAME, f"field 'io.{CHUNK_KEY}': {exc} (value: "
                                             f"{str(spec)[:80]})") from None
    if not isinstance(shape, list) or len(shape) != 3 or shape[1] != spec["size"]:
        raise _refuse(bundle, MANIFEST_NAME, f"field 'io.actions.shape' must be ['batch', "
                                             f"{spec['size']}, act_dim] for chunks of "
                                             f"{spec['size']} (value: {shape!r})")
    return dict(spec)


def _check_chunk(bundle: Path, session: Any, chunk: Mapping[str, Any] | None) -> None:
    """Refuse a graph whose ``actions`` are not the manifest's: (batch, k, act_dim) for chunks
    of k (``chunk``), (batch, act_dim) otherwise."""
    shape = list(session.get_outputs()[0].shape)
    if (chunk is None and len(shape) == 3) or \
            (chunk is not None and (len(shape) != 3 or shape[1] != chunk["size"])):
        what = "one action" if chunk is None else f"chunks of {chunk['size']} actions"
        raise _refuse(bundle, MODEL_NAME, f"graph output {OUTPUT_NAME!r} {shape} does not "
                                          f"give the manifest's {what}")


def manifest_images(bundle: Path, manifest: Mapping[str, Any]) -> dict[str, tuple[int, int, int]]:
    """The image inputs the manifest's ``io.images`` lists: name -> one frame's (height,
    width, 3); empty when it lists none (a state policy). Each must be a uint8 RGB HWC
    tensor ``<camera>_image`` of shape ``["batch", H, W, 3]``, named once."""
    entries = manifest["io"].get("images", [])
    if not isinstance(entries, list):
        raise _refuse(bundle, MANIFEST_NAME, "field 'io.images' must be a list")
    images: dict[str, tuple[int, int, int]] = {}
    for k, entry in enumerate(entries):
        where = f"field 'io.images.{k}'"
        if not isinstance(entry, dict):
            raise _refuse(bundle, MANIFEST_NAME, f"{where} must be an object")
        name, shape = entry.get("name"), entry.get("shape")
        if not isinstance(name, str) or not name.endswith(IMAGE_SUFFIX) or name in images \
                or name == INPUT_NAME:
            raise _refuse(bundle, MANIFEST_NAME, f"{where}.name must be a new "
                                                 f"'<camera>{IMAGE_SUFFIX}' (value: {name!r})")
        if (not isinstance(shape, list) or len(shape) != 4 or shape[0] != "batch"
                or not all(type(d) is int and 0 < d <= MAX_IMAGE_SIDE for d in shape[1:])
                or shape[3] != 3):
            raise _refuse(bundle, MANIFEST_NAME, f"{where}.shape must be ['batch', height, "
                                                 f"width, 3], sides 1 .. {MAX_IMAGE_SIDE:,} "
                                                 f"(value: {str(shape)[:80]})")
        layout = (entry.get("dtype"), entry.get("layout"), entry.get("channels"))
        if layout != ("uint8", "HWC", "RGB"):
            raise _refuse(bundle, MANIFEST_NAME, f"{where} must be uint8, layout HWC, channels "
                                                 f"RGB (value: {list(layout)!r})")
        images[name] = (shape[1], shape[2], shape[3])
    return images


def _check_graph(bundle: Path, session: Any, obs_dim: int, act_dim: int,
                 images: Mapping[str, tuple[int, int, int]],
                 diffusion: Mapping[str, Any] | None = None) -> None:
    """Refuse a graph whose inputs are not ``obs`` and the manifest's images (any order), or
    whose tensor shapes or image element type differ from the manifest's; a diffusion policy's
    also reads ``noise`` and ``schedule``, and ``n_obs_steps`` frames of each input."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = session.get_outputs()
    extra = [NOISE_NAME, SCHEDULE_NAME] if diffusion is not None else []
    if sorted(inputs) != sorted([INPUT_NAME, *images, *extra]) or \
            [o.name for o in outputs] != [OUTPUT_NAME]:
        wanted = " + ".join([INPUT_NAME, *images, *extra])
        raise _refuse(bundle, MODEL_NAME, f"graph I/O must be {wanted} -> {OUTPUT_NAME!r} "
                                          f"(value: {sorted(inputs)})")
    state = inputs[INPUT_NAME]
    if _width(state.shape) != obs_dim or _width(outputs[0].shape) != act_dim:
        raise _refuse(
            bundle, MODEL_NAME, f"graph shapes {state.shape} -> {outputs[0].shape} differ "
            f"from the manifest's obs {obs_dim} / actions {act_dim}"
        )
    frames = [int(diffusion["n_obs_steps"])] if diffusion is not None else []
    if diffusion is not None and list(state.shape[1:]) != [*frames, obs_dim]:
        raise _refuse(bundle, MODEL_NAME, f"graph input {INPUT_NAME!r} {state.shape} is not "
                                          f"the manifest's ['batch', {frames[0]}, {obs_dim}]")
    for name, shape in images.items():
        arg = inputs[name]
        want = [*frames, *shape]
        if arg.type != "tensor(uint8)" or list(arg.shape[1:]) != want:
            raise _refuse(bundle, MODEL_NAME, f"graph input {name!r} is {arg.type} "
                                              f"{arg.shape}, not the manifest's uint8 "
                                              f"['batch', {', '.join(map(str, want))}]")


def _width(shape: list[Any]) -> Any:
    """The last dimension of a graph tensor's shape; None for a scalar."""
    return shape[-1] if shape else None


# --------------------------------------------------------------------------- providers


def choose_providers(available: list[str] | None = None) -> list[str]:
    """TensorRT, then CUDA, then CPU: those of :data:`PROVIDER_ORDER` that are available.

    ``available`` defaults to ``onnxruntime.get_available_providers()``. CPU is always last.
    """
    if available is None:
        import onnxruntime

        available = list(onnxruntime.get_available_providers())
    chosen = [p for p in PROVIDER_ORDER if p in available]
    return chosen if PROVIDER_ORDER[-1] in chosen else [*chosen, PROVIDER_ORDER[-1]]


def open_onnx_session(
    model: Path, providers: list[str] | None = None, *, cache_dir: Path | None = None
) -> tuple[Any, str]:
    """An ONNX Runtime session on ``model`` (1 intra-op thread) and the provider that leads.

    The TensorRT provider caches its engine in ``cache_dir``. ONNX Runtime silently drops a
    provider whose libraries fail to load, so the reported one is the session's own first.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    requested: list[Any] = []
    for name in providers if providers is not None else choose_providers():
        if name == PROVIDER_ORDER[0] and cache_dir is not None:
            cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            trt = {"trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache_dir)}
            requested.append((name, trt))
        else:
            requested.append(name)
    try:
        session = onnxruntime.InferenceSession(str(model), options, providers=requested)
    except Exception as exc:  # ONNX Runtime's errors derive from Exception directly
        problem = " ".join(f"{model}: ONNX Runtime cannot load it: {exc}".split())
        raise RuntimeRefusal(problem) from exc
    return session, session.get_providers()[0]


# --------------------------------------------------------------------------- TensorRT engine
# Separate from the ONNX Runtime path: a ``.engine`` built on the target (``trtexec`` or the
# TensorRT Python API) is deserialized here and run by :class:`TensorRTPolicy`.


def engine_digest_for(bundle: LoadedPolicy, report_path: Path) -> str:
    """The engine sha256 that the engine report at ``report_path`` records for ``bundle``.

    Refused: a missing or unreadable report, one made from another bundle (its
    ``manifest_sha256`` is not this bundle's), or one whose ``engine_sha256`` is not a hex
    sha256."""
    report_path = Path(report_path)
    try:
        report = strict_json(read_at_most(report_path, MAX_MANIFEST_BYTES))
    except FileNotFoundError:
        raise RuntimeRefusal(f"{report_path}: engine report not found; an engine runs only "
                             "beside the report of its build from this bundle") from None
    except (OSError, ValueError) as exc:
        raise RuntimeRefusal(f"{report_path}: unreadable engine report ({exc})") from None
    if not isinstance(report, dict):
        raise RuntimeRefusal(f"{report_path}: engine report must be a JSON object")
    made_from = report.get("manifest_sha256")
    if made_from != bundle.manifest_sha256:
        raise RuntimeRefusal(f"{report_path}: field 'manifest_sha256' names another bundle "
                             f"than {bundle.bundle} (value: {str(made_from)[:80]!r})")
    digest = report.get("engine_sha256")
    if not is_sha256(digest):
        raise RuntimeRefusal(f"{report_path}: field 'engine_sha256' must be 64 lowercase hex "
                             f"digits (value: {str(digest)[:80]!r})")
    return str(digest)


def load_tensorrt_engine(engine_path: Path, expected_sha256: str, *,
                         images: Sequence[str] = ()) -> Any:
    """Deserialize a TensorRT engine whose bytes hash to ``expected_sha256`` and check its I/O
    tensors are ``obs``, the image inputs ``images`` (each of element type uint8) and
    ``actions``.

    The file is read once; the bytes hashed are the bytes deserialized. Returns the
    ``tensorrt.ICudaEngine``. Raises :class:`RuntimeRefusal` when the file is missing or
    differs from the digest, ``tensorrt`` is not importable, or the engine cannot be
    deserialized.
    """
    engine_path = Path(engine_path)
    if not engine_path.is_file():
        raise RuntimeRefusal(f"{engine_path}: TensorRT engine file not found")
    try:
        data = read_at_most(engine_path, MAX_MEMBER_BYTES)
    except (OSError, ValueError) as exc:
        raise RuntimeRefusal(f"{engine_path}: unreadable TensorRT engine ({exc})") from None
    got = sha256(data).hexdigest()
    if got != expected_sha256:
        raise RuntimeRefusal(f"{engine_path}: sha256 {got} is not the engine the bundle's "
                             f"engine report records ({expected_sha256})")
    try:
        import tensorrt
    except ImportError as exc:
        raise RuntimeRefusal(
            f"{engine_path}: the tensorrt Python module is not importable ({exc}); "
            "use the ONNX bundle with ONNX Runtime instead"
        ) from exc
    runtime = tensorrt.Runtime(tensorrt.Logger(tensorrt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise RuntimeRefusal(f"{engine_path}: TensorRT cannot deserialize the engine")
    names = sorted(engine.get_tensor_name(i) for i in range(engine.num_io_tensors))
    if names != sorted([INPUT_NAME, *images, OUTPUT_NAME]):
        wanted = " + ".join([INPUT_NAME, *images])
        raise RuntimeRefusal(f"{engine_path}: engine I/O must be {wanted} -> {OUTPUT_NAME} "
                             f"(value: {names})")
    for name in images:
        dtype = engine.get_tensor_dtype(name)
        if dtype != tensorrt.DataType.UINT8:
            raise RuntimeRefusal(f"{engine_path}: engine input {name} must be UINT8, as the "
                                 f"bundle's camera frames are (value: {dtype})")
    return engine


def _cudart() -> Any:
    """CUDA's runtime API from ``cuda-python`` (module layout of 12.x and later, then older)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError as exc:
            raise RuntimeRefusal(
                f"the cuda-python module is not importable ({exc}); install it beside "
                "TensorRT (pip install cuda-python), or run the bundle with ONNX Runtime"
            ) from exc
    return cudart


def _checked(result: Any, what: str) -> Any:
    """The value of a ``cuda-python`` call (``(error, *values)``), or a refusal naming it."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise RuntimeRefusal(f"CUDA {what} failed: {error}")
    return values[0] if len(values) == 1 else values


class TensorRTPolicy:
    """A TensorRT engine built on the target for a verified bundle, called like
    :class:`LoadedPolicy`: ``infer(obs (obs_dim,), images) -> actions (act_dim,)`` at batch 1.

    The engine is loaded only when its sha256 is the ``engine_sha256`` of the engine report
    (``report``, default ``engine_report.json`` beside the engine) made from this very bundle
    (its ``manifest_sha256``), see :func:`engine_digest_for`.

    The engine's I/O tensors are bound by name (``obs``, each ``<camera>_image`` of the
    bundle's ``io.images``, ``actions``, (1, k, act_dim) for chunks of k) and must have the
    bundle's shapes; each input (the
    images as uint8) is copied into its device buffer, the engine runs on its own CUDA stream
    (``execute_async_v3``) and the actions are copied back before ``infer`` returns.
    :meth:`close` frees the device buffers.
    """

    provider = "TensorRT"

    def __init__(self, bundle: LoadedPolicy, engine_path: Path, *,
                 report: Path | None = None) -> None:
        engine_path = Path(engine_path)
        if bundle.diffusion is not None:
            raise RuntimeRefusal(f"{engine_path}: a diffusion policy's bundle runs on ONNX "
                                 "Runtime; its TensorRT engine path is not built")
        report = Path(report) if report is not None else engine_path.with_name(REPORT_NAME)
        self.images = dict(bundle.images)
        self.engine = load_tensorrt_engine(engine_path, engine_digest_for(bundle, report),
                                           images=tuple(self.images))
        self.cudart = _cudart()
        self.bundle = bundle.bundle
        self.obs_dim, self.act_dim = bundle.obs_dim, bundle.act_dim
        self.chunk = bundle.chunk
        self.action_shape = bundle.action_shape
        self.action_low, self.action_high = bundle.action_low, bundle.action_high
        self.control_hz = bundle.control_hz
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise RuntimeRefusal(f"{engine_path}: TensorRT cannot create an execution context")
        self._inputs = {INPUT_NAME: np.zeros((1, self.obs_dim), np.float32)}
        self._inputs |= {name: np.zeros((1, *shape), np.uint8)
                         for name, shape in self.images.items()}
        for name, host in self._inputs.items():
            if not self.context.set_input_shape(name, host.shape):
                raise RuntimeRefusal(f"{engine_path}: the engine does not take input {name} "
                                     f"of shape {host.shape}")
        out_shape = tuple(self.context.get_tensor_shape(OUTPUT_NAME))
        if out_shape != (1, *self.action_shape):
            raise RuntimeRefusal(f"{engine_path}: output {OUTPUT_NAME} has shape {out_shape}, "
                                 f"not {(1, *self.action_shape)}")
        self._actions: np.ndarray = np.zeros((1, *self.action_shape), np.float32)
        self._buffers: dict[str, int] = {}
        try:
            for name, host in (*self._inputs.items(), (OUTPUT_NAME, self._actions)):
                self._buffers[name] = int(_checked(self.cudart.cudaMalloc(host.nbytes),
                                                   "cudaMalloc"))
                if not self.context.set_tensor_address(name, self._buffers[name]):
                    raise RuntimeRefusal(f"{engine_path}: cannot bind tensor {name}")
            self.stream = _checked(self.cudart.cudaStreamCreate(), "cudaStreamCreate")
        except RuntimeRefusal:
            self.close()
            raise

    def infer(self, obs: np.ndarray, images: Mapping[str, np.ndarray] | None = None
              ) -> np.ndarray:
        """Actions for one observation and one frame of each image input by name.
        Shape: (obs_dim,) float32 [+ (H, W, 3) uint8 each] -> (act_dim,), or a chunk
        (k, act_dim) for a bundle whose policy emits chunks."""
        cudart = self.cudart
        kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._inputs[INPUT_NAME][0] = obs
        for name in self.images:
            self._inputs[name][0] = (images if images is not None else {})[name]
        for name, host in self._inputs.items():
            _checked(cudart.cudaMemcpyAsync(self._buffers[name], host.ctypes.data, host.nbytes,
                                            kind, self.stream), f"copy of {name} to the device")
        if not self.context.execute_async_v3(int(self.stream)):
            raise RuntimeRefusal(f"{self.bundle}: TensorRT inference failed")
        back = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        _checked(cudart.cudaMemcpyAsync(self._actions.ctypes.data, self._buffers[OUTPUT_NAME],
                                        self._actions.nbytes, back, self.stream),
                 "copy of actions from the device")
        _checked(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        return self._actions.reshape(self.action_shape).copy()

    def close(self) -> None:
        """Free the device buffers and the stream; the policy cannot infer afterwards."""
        for pointer in self._buffers.values():
            self.cudart.cudaFree(pointer)
        self._buffers = {}
        stream = getattr(self, "stream", None)
        if stream is not None:
            self.cudart.cudaStreamDestroy(stream)
            self.stream = None


# --------------------------------------------------------------------------- diffusion sampling
# A diffusion policy's graph (stages/policies/lerobot_diffusion_export.py) reads the last
# ``n_obs_steps`` observations, a block of noise and the scheduler's steps as rows; this section
# keeps the history, draws the noise from the seeded generator the manifest names and computes
# the rows from the scheduler's parameters, so the number of denoising steps is a setting.

DIFFUSION_KEY = "diffusion"
"""Key of the manifest's ``io`` (and of the graph's metadata ``physai.diffusion``) describing a
diffusion policy's sampling: ``n_obs_steps``, ``horizon``, ``n_action_steps``, ``steps``,
``noise`` ``{generator, seed}`` and ``scheduler`` (:func:`diffusion_problem`)."""
DIFFUSION_METADATA = "physai.diffusion"
"""The ONNX metadata entry that carries the same description inside the graph."""
NOISE_NAME = "noise"
"""A diffusion graph's noise input. Shape: (batch, steps + 1, horizon, act_dim), float32."""
SCHEDULE_NAME = "schedule"
"""A diffusion graph's schedule input, one row a step: ``[t, p, q, c_x0, c_s, c_o, sigma, r]``.
Shape: (steps, 8), float32."""
NOISE_GENERATOR = "numpy.random.PCG64"
"""The one noise generator the runtime draws from: ``numpy.random.Generator(PCG64(seed))``,
one ``standard_normal(shape, dtype=float32)`` block a query."""
MAX_DIFFUSION_STEPS = 1_000
"""Most denoising steps, history frames and horizon a manifest may ask for."""
_SCHEDULERS = {"DDPM": {"variance_type"}, "DDIM": {"final_alpha_cumprod"}}
_PREDICTIONS = ("epsilon", "sample", "v_prediction")
_SPACINGS = ("leading", "trailing", "linspace")


def diffusion_problem(spec: object) -> str | None:
    """Why ``spec`` (a manifest's ``io.diffusion``) cannot run here, or None: whole numbers in
    range (``n_action_steps <= horizon - n_obs_steps + 1``, ``steps <= num_train_timesteps``),
    the noise generator :data:`NOISE_GENERATOR` with a seed >= 0, a DDPM (``fixed_small``
    variance) or DDIM scheduler of a known prediction type and timestep spacing, without
    dynamic thresholding, and ``num_train_timesteps`` values of ``alphas_cumprod`` in (0, 1]."""
    if not isinstance(spec, dict):
        return "must be an object"
    sizes = {k: spec.get(k) for k in ("n_obs_steps", "horizon", "n_action_steps", "steps")}
    for key, value in sizes.items():
        if type(value) is not int or not 1 <= value <= MAX_DIFFUSION_STEPS:
            return f"{key} must be a whole number 1 .. {MAX_DIFFUSION_STEPS:,} (value: {value!r})"
    if sizes["n_action_steps"] > sizes["horizon"] - sizes["n_obs_steps"] + 1:  # type: ignore[operator]
        return (f"n_action_steps must be at most horizon - n_obs_steps + 1 (value: "
                f"{sizes['n_action_steps']})")
    noise = spec.get("noise")
    if not isinstance(noise, dict) or noise.get("generator") != NOISE_GENERATOR or \
            type(noise.get("seed")) is not int or noise["seed"] < 0:
        return f"noise must be {{generator: {NOISE_GENERATOR}, seed >= 0}} (value: {noise!r})"
    return _scheduler_problem(spec.get("scheduler"), sizes["steps"])  # type: ignore[arg-type]


def _scheduler_problem(sched: object, steps: int) -> str | None:
    """Why ``sched`` (``io.diffusion.scheduler``) is not a scheduler this runtime steps."""
    if not isinstance(sched, dict) or sched.get("type") not in _SCHEDULERS:
        return f"scheduler.type must be one of {sorted(_SCHEDULERS)}"
    train = sched.get("num_train_timesteps")
    if type(train) is not int or not steps <= train <= 100_000:
        return f"scheduler.num_train_timesteps must be a whole number >= steps (value: {train!r})"
    alphas = sched.get("alphas_cumprod")
    if not isinstance(alphas, list) or len(alphas) != train or \
            not all(type(a) in (int, float) and 0 < a <= 1 for a in alphas):
        return f"scheduler.alphas_cumprod must be {train} numbers in (0, 1]"
    if sched.get("prediction_type") not in _PREDICTIONS or \
            sched.get("timestep_spacing") not in _SPACINGS:
        return (f"scheduler.prediction_type must be one of {list(_PREDICTIONS)} and "
                f"timestep_spacing one of {list(_SPACINGS)}")
    if type(sched.get("steps_offset")) is not int or type(sched.get("clip_sample")) is not bool \
            or type(sched.get("clip_sample_range")) not in (int, float) \
            or sched.get("thresholding") is not False:
        return ("scheduler needs steps_offset (whole), clip_sample (bool), clip_sample_range "
                "and thresholding false")
    if sched["type"] == "DDPM" and sched.get("variance_type") != "fixed_small":
        return f"a DDPM scheduler's variance_type must be fixed_small (value: " \
               f"{sched.get('variance_type')!r})"
    if sched["type"] == "DDIM" and not 0 < float(sched.get("final_alpha_cumprod", 0)) <= 1:
        return "a DDIM scheduler's final_alpha_cumprod must be in (0, 1]"
    return None


def diffusion_timesteps(sched: Mapping[str, Any], steps: int) -> np.ndarray:
    """The scheduler's timesteps for ``steps`` denoising steps, as diffusers' ``set_timesteps``
    spaces them (``leading``, ``trailing`` or ``linspace``). Shape: (steps,), int64,
    descending."""
    train = int(sched["num_train_timesteps"])
    spacing = sched["timestep_spacing"]
    if spacing == "linspace":
        return np.linspace(0, train - 1, steps).round()[::-1].astype(np.int64)
    if spacing == "leading":
        ratio = train // steps
        return (np.arange(0, steps) * ratio).round()[::-1].astype(np.int64) + \
            int(sched["steps_offset"])
    return np.round(np.arange(train, 0, -train / steps)).astype(np.int64) - 1


def diffusion_schedule(sched: Mapping[str, Any], steps: int) -> np.ndarray:
    """The graph's ``schedule`` rows for ``steps`` steps of scheduler ``sched`` (the manifest's
    ``io.diffusion.scheduler``): step i turns the sample s and the network's output o into
    ``c_x0 * clip(p * s + q * o, -r, r) + c_s * s + c_o * o + sigma * z``, diffusers' DDPM
    (``fixed_small`` variance) or DDIM (eta 0) step written as numbers, computed in float64
    from the float32 ``alphas_cumprod``. Shape: (steps, 8) float32, columns
    ``[t, p, q, c_x0, c_s, c_o, sigma, r]``."""
    alphas = np.asarray(sched["alphas_cumprod"], np.float32).astype(np.float64)
    times = diffusion_timesteps(sched, steps)
    train = int(sched["num_train_timesteps"])
    ddpm = sched["type"] == "DDPM"
    final = 1.0 if ddpm else float(sched["final_alpha_cumprod"])
    clip = float(sched["clip_sample_range"]) if sched["clip_sample"] else np.inf
    rows = np.zeros((steps, 8), np.float64)
    for i, t in enumerate(times):
        prev = (times[i + 1] if i + 1 < steps else -1) if ddpm else t - train // steps
        ab, ab_prev = alphas[t], (alphas[prev] if prev >= 0 else final)
        p, q = _x0_terms(sched["prediction_type"], ab)
        if ddpm:
            beta, alpha = 1 - ab / ab_prev, ab / ab_prev
            c_x0 = np.sqrt(ab_prev) * beta / (1 - ab)
            c_s = np.sqrt(alpha) * (1 - ab_prev) / (1 - ab)
            c_o = 0.0
            sigma = np.sqrt(max((1 - ab_prev) / (1 - ab) * beta, 1e-20)) if t > 0 else 0.0
        else:  # DDIM, eta 0: x_prev = sqrt(ab_prev) x0 + sqrt(1 - ab_prev) eps(s, o)
            e_s, e_o = _eps_terms(sched["prediction_type"], ab)
            c_x0, sigma = np.sqrt(ab_prev), 0.0
            c_s, c_o = np.sqrt(1 - ab_prev) * e_s, np.sqrt(1 - ab_prev) * e_o
        rows[i] = (t, p, q, c_x0, c_s, c_o, sigma, clip)
    return rows.astype(np.float32)


def _x0_terms(prediction: str, ab: float) -> tuple[float, float]:
    """(p, q) of the predicted clean sample ``x0 = p * s + q * o``."""
    if prediction == "epsilon":
        return 1 / np.sqrt(ab), -np.sqrt(1 - ab) / np.sqrt(ab)
    if prediction == "sample":
        return 0.0, 1.0
    return np.sqrt(ab), -np.sqrt(1 - ab)


def _eps_terms(prediction: str, ab: float) -> tuple[float, float]:
    """(e_s, e_o) of DDIM's predicted noise ``eps = e_s * s + e_o * o``, from the unclipped x0."""
    if prediction == "epsilon":
        return 0.0, 1.0
    if prediction == "sample":
        return 1 / np.sqrt(1 - ab), -np.sqrt(ab) / np.sqrt(1 - ab)
    return np.sqrt(1 - ab), np.sqrt(ab)


class ObservationHistory:
    """The last ``frames`` observations of every world, by input name, as LeRobot's queues keep
    them: the first observation after a (world's) reset fills its whole window.

    ``push`` takes one step's arrays (worlds, ...) by name; ``stacked`` gives (worlds, frames,
    ...), oldest first. A push with a new world count starts every world afresh.
    """

    def __init__(self, frames: int) -> None:
        if frames < 1:
            raise ValueError(f"a history keeps at least one frame (value: {frames})")
        self.frames = frames
        self._kept: dict[str, np.ndarray] = {}
        self._fresh = np.ones(0, bool)

    def reset(self, worlds: np.ndarray | None = None) -> None:
        """Forget the history of ``worlds`` (a bool mask or indices; None: all)."""
        self._fresh[slice(None) if worlds is None else worlds] = True

    def push(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Add this step's observation of every world. Shape of each: (worlds, ...)."""
        count = len(next(iter(arrays.values())))
        if len(self._fresh) != count or set(arrays) != set(self._kept):
            self._kept = {name: np.zeros((count, self.frames, *np.shape(a)[1:]),
                                         np.asarray(a).dtype) for name, a in arrays.items()}
            self._fresh = np.ones(count, bool)
        fresh = self._fresh
        for name, array in arrays.items():
            kept = self._kept[name]
            kept[:, :-1] = kept[:, 1:]
            kept[:, -1] = array
            kept[fresh] = np.asarray(array)[fresh][:, None]
        self._fresh = np.zeros(count, bool)

    def stacked(self) -> dict[str, np.ndarray]:
        """Every input's window. Shape of each: (worlds, frames, ...), oldest first."""
        if not self._kept:
            raise ValueError("the history is empty: push an observation first")
        return {name: kept.copy() for name, kept in self._kept.items()}


class DiffusionSampler:
    """A diffusion graph (``run``: feed by name -> actions) sampled as a manifest's
    ``io.diffusion`` says: its observation history (:class:`ObservationHistory`), one noise
    block a query from the seeded :data:`NOISE_GENERATOR` and the schedule's rows for
    ``steps`` denoising steps (default: the spec's own).

    Call it every control step with that step's observation by name (``obs`` (worlds, obs_dim)
    and each image (worlds, H, W, 3)): :meth:`observe` on the steps that act from a chunk
    already given, ``__call__`` when a chunk is due, which returns (worlds, n_action_steps,
    act_dim). The generator is seeded once, when the sampler is made.
    """

    def __init__(self, run: Callable[[dict[str, np.ndarray]], np.ndarray],
                 spec: Mapping[str, Any], act_dim: int, steps: int | None = None) -> None:
        problem = diffusion_problem(dict(spec, steps=steps or spec.get("steps")))
        if problem:
            raise ValueError(f"io.{DIFFUSION_KEY}: {problem}")
        self.run = run
        self.spec = dict(spec)
        """The sampling as given (the manifest's ``io.diffusion``)."""
        self.steps = int(steps or spec["steps"])
        self.horizon = int(spec["horizon"])
        self.act_dim = act_dim
        self.chunk_size = int(spec["n_action_steps"])
        self.schedule = diffusion_schedule(spec["scheduler"], self.steps)
        self.history = ObservationHistory(int(spec["n_obs_steps"]))
        self.rng = np.random.Generator(np.random.PCG64(int(spec["noise"]["seed"])))

    def observe(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Keep this step's observation in the history."""
        self.history.push(arrays)

    def reset(self, worlds: np.ndarray | None = None) -> None:
        """Forget the history of ``worlds`` (None: all): their next observation fills it."""
        self.history.reset(worlds)

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """Keep this step's observation, then sample a chunk for every world.
        Shape: -> (worlds, n_action_steps, act_dim) float32."""
        self.observe(arrays)
        feed = self.history.stacked()
        worlds = len(feed[INPUT_NAME])
        feed[NOISE_NAME] = self.rng.standard_normal(
            (worlds, self.steps + 1, self.horizon, self.act_dim), dtype=np.float32)
        feed[SCHEDULE_NAME] = self.schedule
        return np.asarray(self.run(feed), np.float32)


# --------------------------------------------------------------------------- control loop


CHUNK_KEY = "chunk"
"""Key of the manifest's ``io`` that says how a policy's chunks of actions run, e.g.
``{"size": 10, "execute": 5}`` or ``{"size": 10, "ensemble": 0.01}``; absent: one action a
query."""


class ActionChunks:
    """Turns a policy's chunks of ``size`` actions into one action a step, for ``worlds`` worlds.

    A policy that emits chunks (ONNX output ``actions`` of shape (batch, size, act_dim), as
    ACT, diffusion and pi0 do) runs one of two ways:

    - ``execute=n``: run the first ``n`` actions of a chunk (``n <= size``), then query again;
      the policy is asked every ``n`` steps.
    - ``ensemble=m``: query every step and act on the weighted mean of every chunk's action for
      this step (at most ``size`` of them), the i-th oldest weighted ``exp(-m * i)``: ACT's
      temporal ensembling (its default ``m`` is 0.01, which favours older predictions).

    Use: ``chunk = policy(obs) if chunks.due() else None; action = chunks.step(chunk)``, and
    :meth:`reset` the worlds whose episode starts again. Every world of a batch that is due
    takes its row of the chunk; the others ignore theirs. A chunk holds at most
    :data:`MAX_CHUNK_SIZE` actions: a larger size is a ValueError before anything is allocated.
    """

    def __init__(self, size: int, *, execute: int | None = None, ensemble: float | None = None,
                 worlds: int = 1) -> None:
        if size < 1 or worlds < 1:
            raise ValueError(f"chunk size and worlds must be positive (values: {size}, {worlds})")
        if size > MAX_CHUNK_SIZE:
            raise ValueError(f"chunk size must be at most {MAX_CHUNK_SIZE:,} actions (value: "
                             f"{size:,})")
        if (execute is None) == (ensemble is None):
            raise ValueError("a chunk runs by execute=n or by ensemble=m, exactly one of them")
        if execute is not None and not 1 <= execute <= size:
            raise ValueError(f"chunk execute must be 1..{size} (value: {execute})")
        if ensemble is not None and not (np.isfinite(ensemble) and ensemble >= 0):
            raise ValueError(f"chunk ensemble must be a finite number >= 0 (value: {ensemble})")
        self.size, self.execute, self.ensemble, self.worlds = size, execute, ensemble, worlds
        self._weights = np.exp(-(ensemble or 0.0) * np.arange(size + 1))
        self._acc: np.ndarray | None = None
        self._wsum = np.zeros((worlds, size))
        self._count = np.zeros((worlds, size), np.int64)
        self._left = np.zeros(worlds, np.int64)
        self._pos = np.zeros(worlds, np.int64)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], worlds: int = 1) -> ActionChunks:
        """From a manifest's ``io.chunk`` (``size`` and ``execute`` or ``ensemble``)."""
        return cls(int(spec["size"]), execute=spec.get("execute"), ensemble=spec.get("ensemble"),
                   worlds=worlds)

    def spec(self) -> dict[str, Any]:
        """What a manifest's ``io.chunk`` records."""
        how = {"execute": self.execute} if self.execute is not None else {"ensemble": self.ensemble}
        return {"size": self.size, **how}

    def due(self) -> bool:
        """Whether this step needs a new chunk: always when ensembling, else when a world has
        run the actions it takes from its last chunk."""
        return self.ensemble is not None or bool((self._left == 0).any())

    def reset(self, worlds: np.ndarray | None = None) -> None:
        """Forget the chunks of ``worlds`` (a bool mask or indices; None: all)."""
        where = slice(None) if worlds is None else worlds
        if self._acc is not None:
            self._acc[where] = 0.0
        self._wsum[where] = 0.0
        self._count[where] = 0
        self._left[where] = 0
        self._pos[where] = 0

    def step(self, chunk: np.ndarray | None) -> np.ndarray:
        """This step's action of every world. ``chunk``: (worlds, size, act_dim), or None when
        :meth:`due` was False. Returns (worlds, act_dim) float32."""
        if chunk is not None:
            chunk = np.asarray(chunk, np.float64)
            if chunk.ndim != 3 or chunk.shape[:2] != (self.worlds, self.size):
                raise ValueError(f"chunk of shape {chunk.shape}; expected ({self.worlds}, "
                                 f"{self.size}, act_dim)")
            if self._acc is None:
                self._acc = np.zeros_like(chunk)
        elif self.due():
            raise ValueError("a new chunk is due this step")
        if self._acc is None:
            raise ValueError("the first step needs a chunk")
        if self.ensemble is not None and chunk is not None:
            return self._ensembled(self._acc, chunk)
        fresh = self._left == 0
        if fresh.any() and chunk is not None:
            self._acc[fresh] = chunk[fresh]
            self._left[fresh] = self.execute or self.size
            self._pos[fresh] = 0
        action = self._acc[np.arange(self.worlds), self._pos]
        self._pos += 1
        self._left -= 1
        return action.astype(np.float32)

    def _ensembled(self, acc: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        w = self._weights[self._count]
        acc += w[..., None] * chunk
        self._wsum += w
        self._count += 1
        action = acc[:, 0] / self._wsum[:, 0, None]
        # Slide the window one step: slot 0 is spent, a new last slot opens empty.
        acc[:, :-1] = acc[:, 1:]
        acc[:, -1] = 0.0
        self._wsum[:, :-1] = self._wsum[:, 1:]
        self._wsum[:, -1] = 0.0
        self._count[:, :-1] = self._count[:, 1:]
        self._count[:, -1] = 0
        return action.astype(np.float32)


class Robot(Protocol):
    """What the loop drives: read an observation, apply an action."""

    def read(self) -> np.ndarray:
        """The current observation. Shape: (obs_dim,)."""
        ...

    def apply(self, action: np.ndarray) -> None:
        """Apply one action. Shape: (act_dim,), within the manifest's range."""
        ...


class Policy(Protocol):
    """What the loop runs; :class:`LoadedPolicy` is one."""

    @property
    def obs_dim(self) -> int: ...
    @property
    def act_dim(self) -> int: ...
    @property
    def action_low(self) -> np.ndarray: ...
    @property
    def action_high(self) -> np.ndarray: ...

    def infer(self, obs: np.ndarray, images: Mapping[str, np.ndarray] | None = None
              ) -> np.ndarray:
        """Shape: (obs_dim,) float32 [+ one (H, W, 3) uint8 frame per image input] ->
        (act_dim,); a policy with a ``chunk`` attribute (a manifest's ``io.chunk``) gives a
        chunk (k, act_dim)."""
        ...


@dataclass(frozen=True)
class LoopStats:
    """What one :meth:`ControlLoop.run` did. Latencies are of inference calls, microseconds."""

    steps: int
    deadline_misses: int
    """Steps whose inference or whole step ended after the step's deadline."""
    safe_holds: int
    """Steps that applied the safe action: malformed inputs + overruns + bad outputs."""
    malformed_inputs: int
    """Observations of the wrong type, dtype or shape, or holding NaN or inf; for a policy that
    sees, also steps whose camera frames were missing or not uint8 (H, W, 3) as it reads."""
    inference_overruns: int
    """Inferences that ended after the step's deadline; their result was discarded."""
    bad_outputs: int
    """Policy outputs of the wrong shape or holding NaN or inf."""
    skipped_periods: int
    """Grid slots skipped to resynchronise after a step overran into a later slot."""
    latency_p50_us: float
    latency_p99_us: float
    latency_max_us: float
    elapsed_s: float
    queries: int = 0
    """Calls of the policy: one a step for a policy of one action a query; for one that emits
    chunks, only the steps a chunk was due. The latencies are of these calls."""


@dataclass
class _Tally:
    """What :meth:`ControlLoop.run` counts as it goes."""

    queries: int = 0
    malformed: int = 0
    overruns: int = 0
    bad: int = 0


Cameras = Callable[[], Mapping[str, np.ndarray]]
"""The frames of a robot's cameras now, by image input name: each (H, W, 3) uint8, RGB, HWC."""


@dataclass
class ControlLoop:
    """Fixed-rate ``read -> infer -> apply`` against ``robot``.

    Step ``k`` of the grid starts at ``t0 + k * period`` and must finish by the next slot;
    deadlines are absolute, so timing errors never accumulate. The loop is single-threaded:
    an inference that returns after the deadline has its result discarded and the safe
    action applied at once. ``safe_action`` defaults to the last good action (zeros before
    the first); every applied action is clipped to the policy's action range.

    A policy that sees (its ``images`` name its image inputs and their (H, W, 3) shapes) needs
    ``cameras``: each step, after ``robot.read()``, the loop calls it once and passes the
    frames to the policy by name; the time it takes counts against the step's deadline.

    A policy that emits chunks of actions (its ``chunk``, the manifest's ``io.chunk``) runs
    them by :class:`ActionChunks`: it is queried only on steps a chunk is due, the other
    steps act from the chunks already given. A step that holds the safe action forgets the
    chunks, so the next good step queries afresh; so does a step at which ``new_episode``
    (when given) says the robot started a new episode. A diffusion policy (its ``observe``
    and ``reset``) is shown every good step's observation for its history, and its history
    is forgotten with its chunks.
    """

    policy: Policy
    robot: Robot
    rate_hz: float
    safe_action: np.ndarray | None = None
    cameras: Cameras | None = None
    new_episode: Callable[[], bool] | None = None
    """Called after each ``robot.read()``; True when an episode started with that
    observation (a simulated robot's reset), whose chunks start afresh."""
    _last_good: np.ndarray = field(init=False, repr=False)
    _images: dict[str, tuple[int, int, int]] = field(init=False, repr=False)
    _chunks: ActionChunks | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.rate_hz > 0:
            raise ValueError(f"rate_hz must be positive (value: {self.rate_hz})")
        self._images = dict(getattr(self.policy, "images", None) or {})
        if self._images and self.cameras is None:
            raise ValueError(f"the policy reads camera images {sorted(self._images)}; pass "
                             f"cameras= (a callable giving them by name)")
        spec = getattr(self.policy, "chunk", None)
        self._chunks = ActionChunks.from_spec(spec) if spec else None
        self._last_good = np.zeros(self.policy.act_dim, np.float32)
        if self.safe_action is not None:
            safe = np.asarray(self.safe_action, np.float32)
            if safe.shape != (self.policy.act_dim,) or not np.isfinite(safe).all():
                raise ValueError(f"safe_action must be {self.policy.act_dim} finite numbers")
            self.safe_action = self._clip(safe)

    def _forget(self) -> None:
        """Start the chunks afresh, and a diffusion policy's history (its ``reset``)."""
        if self._chunks is not None:
            self._chunks.reset()
        reset = getattr(self.policy, "reset", None)
        if reset is not None:
            reset()

    def _clip(self, action: np.ndarray) -> np.ndarray:
        return np.clip(action, self.policy.action_low, self.policy.action_high).astype(np.float32)

    def _safe(self) -> np.ndarray:
        return self.safe_action if self.safe_action is not None else self._last_good.copy()

    def _valid(self, obs: object) -> bool:
        return (
            isinstance(obs, np.ndarray)
            and obs.shape == (self.policy.obs_dim,)
            and obs.dtype.kind == "f"
            and bool(np.isfinite(obs).all())
        )

    def _frames(self) -> dict[str, np.ndarray] | None:
        """This step's frame of every image input the policy reads, from ``cameras``; None
        when one is missing or not a uint8 array of its input's (H, W, 3) shape."""
        given = self.cameras() if self.cameras is not None else None
        frames: dict[str, np.ndarray] = {}
        for name, shape in self._images.items():
            frame = given.get(name) if isinstance(given, Mapping) else None
            if not (isinstance(frame, np.ndarray) and frame.dtype == np.uint8
                    and frame.shape == shape):
                return None
            frames[name] = frame
        return frames

    def run(self, steps: int) -> LoopStats:
        """Run ``steps`` control steps at ``rate_hz`` and return what happened."""
        clock = time.perf_counter_ns
        period = round(1e9 / self.rate_hz)
        latencies = np.zeros(steps, np.int64)
        tally = _Tally()
        misses = holds = skipped = 0
        start = clock()
        slot = 0
        for _ in range(steps):
            deadline = start + (slot + 1) * period
            obs = self.robot.read()
            if self._chunks is not None and self.new_episode is not None and self.new_episode():
                self._forget()
            frames = self._frames() if self._images else None
            action, late = self._decide(obs, frames, deadline, clock, tally, latencies)
            if action is None:
                holds += 1
                if self._chunks is not None:
                    self._forget()
                self.robot.apply(self._safe())
            else:
                self._last_good = action
                self.robot.apply(action)
            now = clock()
            if late or now > deadline:
                misses += 1
            # Next slot on the absolute grid; skip slots already over (keeps phase, no drift).
            next_slot = max(slot + 1, (now - start) // period)
            skipped += next_slot - slot - 1
            slot = next_slot
            _sleep_until(start + slot * period, clock)
        elapsed = (clock() - start) / 1e9
        us = latencies[:tally.queries].astype(np.float64) / 1e3
        p50, p99, top = np.percentile(us, [50, 99, 100]) if tally.queries else (0.0, 0.0, 0.0)
        return LoopStats(
            steps=steps,
            deadline_misses=misses,
            safe_holds=holds,
            malformed_inputs=tally.malformed,
            inference_overruns=tally.overruns,
            bad_outputs=tally.bad,
            skipped_periods=skipped,
            latency_p50_us=float(p50),
            latency_p99_us=float(p99),
            latency_max_us=float(top),
            elapsed_s=elapsed,
            queries=tally.queries,
        )

    def _decide(self, obs: object, frames: dict[str, np.ndarray] | None, deadline: int,
                clock: Callable[[], int], tally: _Tally, latencies: np.ndarray
                ) -> tuple[np.ndarray | None, bool]:
        """This step's clipped action, None to hold the safe action, and whether the policy's
        call ended after ``deadline``. The policy is called unless its chunks give this step's
        action; each call's nanoseconds go to ``latencies``."""
        if not (self._valid(obs) and (frames is not None or not self._images)):
            tally.malformed += 1
            return None, False
        chunks = self._chunks
        if chunks is not None and not chunks.due():
            observe = getattr(self.policy, "observe", None)
            if observe is not None:  # a diffusion policy's history takes every step
                observe(np.asarray(obs, np.float32), frames)
            return self._clip(chunks.step(None)[0]), False
        state = np.asarray(obs, np.float32)
        t0 = clock()
        out = self.policy.infer(state, frames) if self._images else self.policy.infer(state)
        t1 = clock()
        latencies[tally.queries] = t1 - t0
        tally.queries += 1
        if t1 > deadline:
            tally.overruns += 1
            return None, True
        shape = (self.policy.act_dim,) if chunks is None else (chunks.size, self.policy.act_dim)
        if out.shape != shape or not np.isfinite(out).all():
            tally.bad += 1
            return None, False
        return self._clip(out if chunks is None else chunks.step(out[None])[0]), False


def _sleep_until(target_ns: int, clock: Any) -> None:
    """Sleep until ``_SPIN_NS`` before ``target_ns``, then spin to it."""
    remaining = target_ns - clock()
    if remaining > _SPIN_NS:
        time.sleep((remaining - _SPIN_NS) / 1e9)
    while clock() < target_ns:
        pass


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """Command line on the robot: check a bundle (its signature by ``--trust``, or
    ``--allow-unsigned``), extract it into ``--workdir``, open its policy and print its I/O
    contract. Exit status 2 on a refusal, with the reason in one line."""
    parser = argparse.ArgumentParser(prog="runtime.py", description=main.__doc__)
    parser.add_argument("bundle", type=Path, help="the bundle tar file")
    parser.add_argument("--workdir", type=Path, required=True,
                        help="an empty or new folder to extract the bundle into")
    parser.add_argument("--trust", type=Path, help="PEM public key of the bundle's signer")
    parser.add_argument("--allow-unsigned", action="store_true",
                        help="run a bundle no trusted key signed (a warning line each time)")
    parser.add_argument("--provider", action="append", choices=PROVIDER_ORDER,
                        help="ONNX Runtime execution provider (repeat; default: the best found)")
    args = parser.parse_args(argv)
    try:
        policy = load_bundle(args.bundle, args.workdir, providers=args.provider,
                             trust_key=args.trust, allow_unsigned=args.allow_unsigned)
    except RuntimeRefusal as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    vouch = f"signed by the key of {args.trust}" if args.trust else "NOT authenticated"
    seen = "".join(f" + {name} {'x'.join(map(str, shape))} uint8"
                   for name, shape in policy.images.items())
    chunks = ""
    if policy.chunk is not None:
        how = ", ".join(f"{k} {v:g}" for k, v in policy.chunk.items() if k != "size")
        chunks = f" in chunks of {policy.chunk['size']} ({how})"
    if policy.diffusion is not None:
        sampler = policy.diffusion
        chunks += (f", diffusion over {sampler.history.frames} observations, "
                   f"{sampler.steps} denoising steps")
    print(f"{args.bundle}: {vouch}; obs {policy.obs_dim}{seen} -> actions {policy.act_dim}"
          f"{chunks} at {policy.control_hz:g} Hz on {policy.provider}; extracted to "
          f"{args.workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
