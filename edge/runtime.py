"""On-robot runtime: load and verify a policy bundle, then run it in a fixed-rate control loop.

This module is copied to the robot alone, so it imports only the standard library, numpy and,
inside functions, ``onnxruntime`` or ``tensorrt``; nothing from the project.

- :func:`load_bundle` extracts a bundle tar (``manifest.json`` first, then payload members)
  safely, checks every member's size and sha256 against the manifest's ``files`` map and
  refuses, with a one-line :class:`RuntimeRefusal` naming the bundle and the member, any
  unsafe name, non-regular member, oversize, unlisted, duplicate or missing member. Given a
  trust key (a PEM public key), it also refuses an unsigned bundle and one whose signature
  (``bundle.sig``, OpenSSF model-signing, checked with the ``model-signing`` package) was made
  by another key or over other content than the bundle now holds.
- The execution provider is TensorRT when ONNX Runtime offers it, then CUDA, then CPU
  (:func:`choose_providers`). :class:`TensorRTPolicy` is the separate path for an engine built
  on the target (``engine.py``): the same ``infer`` as the ONNX Runtime policy, on a TensorRT
  execution context with device buffers from ``cuda-python``.
- :class:`ControlLoop` runs ``read -> infer -> apply`` on an absolute ``perf_counter_ns``
  grid. A malformed observation (wrong type, dtype or shape, NaN or inf) or an inference that
  ends after the step's deadline makes the step apply the safe action instead, and is counted.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any, Protocol

import numpy as np

MANIFEST_NAME = "manifest.json"
"""Name of the manifest member, always the first member of a bundle."""
FORMAT_VERSION = 1
"""The bundle layout this runtime reads and :mod:`edge.bundle` writes."""
MODEL_NAME = "policy.onnx"
INPUT_NAME = "obs"
OUTPUT_NAME = "actions"
MAX_MEMBER_BYTES = 1 << 30
"""Default cap on one member's size (1 GiB)."""
MAX_MANIFEST_BYTES = 16 << 20
"""Cap on the manifest member's size (16 MiB)."""
SIGNATURE_NAME = "bundle.sig"
"""The signature member of a signed bundle: the last member, not listed in the manifest (it
signs the manifest and every listed member, in the OpenSSF model-signing format)."""
MAX_SIGNATURE_BYTES = 1 << 20
"""Cap on the signature member's size (1 MiB)."""
PROVIDER_ORDER = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
"""Execution providers in order of preference; CPU is always the last resort."""

REGULAR_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)
"""Tar member types of a regular file, as :mod:`edge.bundle` writes and accepts them."""

_SPIN_NS = 300_000
"""The loop sleeps until this close to a slot boundary, then spins (sleep overshoots ~60 us)."""


class RuntimeRefusal(Exception):
    """A bundle or engine the runtime will not run; the message is one line."""


def _refuse(bundle: Path, member: str, problem: str) -> RuntimeRefusal:
    where = f"{bundle}: member {member!r}" if member else str(bundle)
    return RuntimeRefusal(" ".join(f"{where}: {problem}".split()))


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

    def infer(self, obs: np.ndarray) -> np.ndarray:
        """Actions for one observation. Shape: (obs_dim,) float32 -> (act_dim,)."""
        out = self.session.run([OUTPUT_NAME], {INPUT_NAME: obs.reshape(1, self.obs_dim)})[0]
        return np.asarray(out).reshape(self.act_dim)


def load_bundle(
    path: Path,
    workdir: Path,
    *,
    providers: list[str] | None = None,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    trust_key: Path | None = None,
) -> LoadedPolicy:
    """Extract and verify the bundle at ``path`` into ``workdir`` and open its policy.

    ``workdir`` is created when missing and must be empty; on refusal nothing is left in it.
    ``providers`` overrides :func:`choose_providers` (e.g. ``["CPUExecutionProvider"]``).
    With ``trust_key`` (PEM public key file) the bundle must carry a signature by that key over
    exactly its content. Raises :class:`RuntimeRefusal`.
    """
    path, workdir = Path(path), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if any(workdir.iterdir()):
        raise _refuse(path, "", f"work folder is not empty: {workdir}")
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=workdir))
    try:
        manifest, signature = _extract_verified(path, staging, max_member_bytes)
        if trust_key is not None:
            verify_signature(path, staging, signature, Path(trust_key))
        for item in staging.iterdir():
            item.rename(workdir / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    try:
        return _open_policy(path, workdir, manifest, providers)
    except RuntimeRefusal:
        for item in workdir.iterdir():
            shutil.rmtree(item) if item.is_dir() else item.unlink()
        raise


def _extract_verified(bundle: Path, into: Path, cap: int) -> tuple[dict[str, Any], bytes | None]:
    """Stream the tar into ``into``, checking each member; return the manifest and the
    signature member's bytes (None for an unsigned bundle), which is not written to ``into``."""
    if not bundle.is_file():
        raise _refuse(bundle, "", "bundle file not found")
    try:
        with tarfile.open(bundle, "r:") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST_NAME or first.type not in REGULAR_TYPES:
                raise _refuse(bundle, MANIFEST_NAME, "must be the first member, a regular file")
            if first.size > MAX_MANIFEST_BYTES:
                raise _refuse(bundle, MANIFEST_NAME, f"{first.size} bytes is too large")
            raw = _read(tar, first)
            manifest = _parse_manifest(bundle, raw)
            listed = manifest["files"]
            (into / MANIFEST_NAME).write_bytes(raw)
            seen: set[str] = set()
            signature: bytes | None = None
            while (member := tar.next()) is not None:
                if signature is not None:
                    raise _refuse(bundle, member.name, f"follows {SIGNATURE_NAME}, which must "
                                                       "be the last member")
                if member.name == SIGNATURE_NAME and SIGNATURE_NAME not in listed:
                    signature = read_signature_member(bundle, tar, member)
                    continue
                _extract_member(bundle, tar, member, listed, seen, into, cap)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise _refuse(bundle, "", f"unreadable tar archive: {exc}") from exc
    missing = sorted(set(listed) - seen)
    if missing:
        raise _refuse(bundle, missing[0], "listed in the manifest but missing from the archive")
    return dict(manifest), signature


def read_signature_member(bundle: Path, tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """The bytes of the signature member, checked to be a small regular file."""
    if member.type not in REGULAR_TYPES:
        raise _refuse(bundle, SIGNATURE_NAME, "not a regular file (link, device, folder or other)")
    if member.size > MAX_SIGNATURE_BYTES:
        raise _refuse(bundle, SIGNATURE_NAME, f"{member.size} bytes exceeds the signature cap "
                                              f"{MAX_SIGNATURE_BYTES}")
    return _read(tar, member)


def verify_signature(bundle: Path, folder: Path, signature: bytes | None, trust_key: Path) -> None:
    """Refuse unless ``signature`` was made with the private key of ``trust_key`` (a PEM public
    key file) over exactly the files in ``folder``: the bundle's manifest and listed members,
    as extracted. Uses the ``model-signing`` package (imported only here)."""
    if signature is None:
        raise _refuse(bundle, SIGNATURE_NAME, f"missing: the bundle is unsigned and a trust key "
                                              f"was given ({trust_key})")
    if not trust_key.is_file():
        raise _refuse(bundle, "", f"trust key file not found: {trust_key}")
    try:
        from model_signing import verifying
    except ImportError as exc:
        raise _refuse(bundle, SIGNATURE_NAME, f"cannot check the signature: the model-signing "
                                              f"package is not importable ({exc}); install it "
                                              "with: pip install model-signing") from exc
    with tempfile.TemporaryDirectory(prefix="physai-signature-") as scratch:
        sig = Path(scratch) / SIGNATURE_NAME
        sig.write_bytes(signature)
        try:
            verifying.Config().use_elliptic_key_verifier(public_key=trust_key).verify(folder, sig)
        except Exception as exc:  # model-signing raises ValueError and its parsers' errors
            raise _refuse(bundle, SIGNATURE_NAME, signature_problem(exc, trust_key)) from None


def signature_problem(exc: BaseException, trust_key: Path) -> str:
    """One line saying why model-signing refused a signature, without bytes or digests."""
    text = str(exc).replace("\\'", "'").replace('"', "'")
    if "Key mismatch" in text:
        return f"signed by another key than the trusted one ({trust_key})"
    if "Signature mismatch" in text or "Hash mismatch" in text or "Extra files" in text:
        for marker, what in (("Hash mismatch for '", "differs from"),
                             ("Extra files found in model", "is not in"),
                             ("Missing files in model", "is missing from")):
            if marker in text:
                detail = text.split(marker, 1)[1]
                name = detail.split("'", 1)[0] if "'" in detail else detail.split(":")[-1]
                return f"content {what} what was signed ({name.strip(' :[]')})"
        return "content differs from what was signed"
    first = text.strip().splitlines()[0][:200] if text.strip() else type(exc).__name__
    return f"signature does not verify with {trust_key}: {first}"


def _parse_manifest(bundle: Path, raw: bytes) -> dict[str, Any]:
    """The manifest as :func:`edge.bundle.verify_bundle` accepts it: one JSON object without
    repeated keys or non-finite numbers, of format 1, whose ``files`` map every member name to
    its ``bytes`` and ``sha256``."""

    try:
        manifest = strict_json(raw)
    except ValueError as exc:
        raise _refuse(bundle, MANIFEST_NAME, f"invalid manifest: {exc}") from exc
    if not isinstance(manifest, dict):
        raise _refuse(bundle, MANIFEST_NAME, "invalid manifest: not a JSON object")
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise _refuse(bundle, MANIFEST_NAME, f"format_version {version!r} is not "
                                             f"{FORMAT_VERSION}, the one this runtime reads")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(e, dict) and sorted(e) == ["bytes", "sha256"] for e in files.values()
    ):
        raise _refuse(bundle, MANIFEST_NAME, "invalid manifest: 'files' must map each member "
                                             "to its 'bytes' and 'sha256'")
    return manifest


def _extract_member(
    bundle: Path,
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    listed: dict[str, Any],
    seen: set[str],
    into: Path,
    cap: int,
) -> None:
    name = member.name
    if name in seen or name == MANIFEST_NAME:
        raise _refuse(bundle, name, "duplicate member")
    problem = member_name_problem(name)
    if problem:
        raise _refuse(bundle, name, problem)
    if member.type not in REGULAR_TYPES:
        raise _refuse(bundle, name, "not a regular file (link, device, folder or other)")
    seen.add(name)
    entry = listed.get(name)
    if not isinstance(entry, dict):
        raise _refuse(bundle, name, "not listed in the manifest")
    if member.size > cap:
        raise _refuse(bundle, name, f"{member.size} bytes exceeds the member cap {cap}")
    if member.size != entry.get("bytes"):
        raise _refuse(bundle, name, f"size {member.size} differs from the manifest's")
    source = tar.extractfile(member)
    if source is None:
        raise _refuse(bundle, name, "cannot be read")
    target = into.joinpath(*name.split("/"))
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = sha256()
    with target.open("xb") as out:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != entry.get("sha256"):
        raise _refuse(bundle, name, "sha256 differs from the manifest's")


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    stream = tar.extractfile(member)
    return stream.read() if stream is not None else b""


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

    return json.loads(raw.decode("utf-8"), object_pairs_hook=unique, parse_constant=finite)


def _open_policy(
    bundle: Path, workdir: Path, manifest: dict[str, Any], providers: list[str] | None
) -> LoadedPolicy:
    """Read the I/O contract from the manifest and open the ONNX model on it."""
    try:
        io = manifest["io"]
        obs_dim = int(io["obs"]["shape"][-1])
        act_dim = int(io["actions"]["shape"][-1])
        low, high = io["actions"].get("range", [-1.0, 1.0])
        control_hz = float(manifest["control_hz"])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        problem = f"bad or missing io/control_hz field: {exc!r}"
        raise _refuse(bundle, MANIFEST_NAME, problem) from exc
    if not 0 < control_hz < float("inf"):
        raise _refuse(bundle, MANIFEST_NAME, f"control_hz must be above 0 (value: {control_hz})")
    if MODEL_NAME not in manifest["files"]:
        raise _refuse(bundle, MODEL_NAME, "missing from the bundle")
    try:
        session, provider = open_onnx_session(workdir / MODEL_NAME, providers, cache_dir=workdir)
    except RuntimeRefusal as exc:
        raise _refuse(bundle, MODEL_NAME, f"ONNX Runtime cannot load it: {exc.__cause__}") from exc
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if [i.name for i in inputs] != [INPUT_NAME] or [o.name for o in outputs] != [OUTPUT_NAME]:
        raise _refuse(bundle, MODEL_NAME, f"graph I/O must be {INPUT_NAME!r} -> {OUTPUT_NAME!r}")
    if _width(inputs[0].shape) != obs_dim or _width(outputs[0].shape) != act_dim:
        raise _refuse(
            bundle, MODEL_NAME, f"graph shapes {inputs[0].shape} -> {outputs[0].shape} differ "
            f"from the manifest's obs {obs_dim} / actions {act_dim}"
        )
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
    )


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


def load_tensorrt_engine(engine_path: Path) -> Any:
    """Deserialize a TensorRT engine and check its I/O tensors are ``obs`` and ``actions``.

    Returns the ``tensorrt.ICudaEngine``. Raises :class:`RuntimeRefusal` when ``tensorrt`` is
    not importable, the file is missing, or the engine cannot be deserialized.
    """
    try:
        import tensorrt
    except ImportError as exc:
        raise RuntimeRefusal(
            f"{engine_path}: the tensorrt Python module is not importable ({exc}); "
            "use the ONNX bundle with ONNX Runtime instead"
        ) from exc
    engine_path = Path(engine_path)
    if not engine_path.is_file():
        raise RuntimeRefusal(f"{engine_path}: TensorRT engine file not found")
    runtime = tensorrt.Runtime(tensorrt.Logger(tensorrt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
    if engine is None:
        raise RuntimeRefusal(f"{engine_path}: TensorRT cannot deserialize the engine")
    names = sorted(engine.get_tensor_name(i) for i in range(engine.num_io_tensors))
    if names != sorted([INPUT_NAME, OUTPUT_NAME]):
        raise RuntimeRefusal(f"{engine_path}: engine I/O must be obs -> actions (value: {names})")
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
    :class:`LoadedPolicy`: ``infer(obs (obs_dim,)) -> actions (act_dim,)`` at batch 1.

    The engine's I/O tensors are found by name (``obs``, ``actions``) and must have the
    bundle's widths; the observation is copied into a device buffer, the engine runs on its
    own CUDA stream (``execute_async_v3``) and the actions are copied back before ``infer``
    returns. :meth:`close` frees the device buffers.
    """

    provider = "TensorRT"

    def __init__(self, bundle: LoadedPolicy, engine_path: Path) -> None:
        engine_path = Path(engine_path)
        self.engine = load_tensorrt_engine(engine_path)
        self.cudart = _cudart()
        self.bundle = bundle.bundle
        self.obs_dim, self.act_dim = bundle.obs_dim, bundle.act_dim
        self.action_low, self.action_high = bundle.action_low, bundle.action_high
        self.control_hz = bundle.control_hz
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise RuntimeRefusal(f"{engine_path}: TensorRT cannot create an execution context")
        if not self.context.set_input_shape(INPUT_NAME, (1, self.obs_dim)):
            raise RuntimeRefusal(f"{engine_path}: the engine does not take input {INPUT_NAME} "
                                 f"of shape (1, {self.obs_dim})")
        out_shape = tuple(self.context.get_tensor_shape(OUTPUT_NAME))
        if out_shape != (1, self.act_dim):
            raise RuntimeRefusal(f"{engine_path}: output {OUTPUT_NAME} has shape {out_shape}, "
                                 f"not (1, {self.act_dim})")
        self._obs = np.zeros((1, self.obs_dim), np.float32)
        self._actions = np.zeros((1, self.act_dim), np.float32)
        self._buffers: dict[str, int] = {}
        try:
            for name, host in ((INPUT_NAME, self._obs), (OUTPUT_NAME, self._actions)):
                self._buffers[name] = int(_checked(self.cudart.cudaMalloc(host.nbytes),
                                                   "cudaMalloc"))
                if not self.context.set_tensor_address(name, self._buffers[name]):
                    raise RuntimeRefusal(f"{engine_path}: cannot bind tensor {name}")
            self.stream = _checked(self.cudart.cudaStreamCreate(), "cudaStreamCreate")
        except RuntimeRefusal:
            self.close()
            raise

    def infer(self, obs: np.ndarray) -> np.ndarray:
        """Actions for one observation. Shape: (obs_dim,) float32 -> (act_dim,)."""
        cudart = self.cudart
        self._obs[0] = obs
        kind = cudart.cudaMemcpyKind
        _checked(cudart.cudaMemcpyAsync(self._buffers[INPUT_NAME], self._obs.ctypes.data,
                                        self._obs.nbytes, kind.cudaMemcpyHostToDevice,
                                        self.stream), "copy of obs to the device")
        if not self.context.execute_async_v3(int(self.stream)):
            raise RuntimeRefusal(f"{self.bundle}: TensorRT inference failed")
        _checked(cudart.cudaMemcpyAsync(self._actions.ctypes.data, self._buffers[OUTPUT_NAME],
                                        self._actions.nbytes, kind.cudaMemcpyDeviceToHost,
                                        self.stream), "copy of actions from the device")
        _checked(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        return self._actions.reshape(self.act_dim).copy()

    def close(self) -> None:
        """Free the device buffers and the stream; the policy cannot infer afterwards."""
        for pointer in self._buffers.values():
            self.cudart.cudaFree(pointer)
        self._buffers = {}
        stream = getattr(self, "stream", None)
        if stream is not None:
            self.cudart.cudaStreamDestroy(stream)
            self.stream = None


# --------------------------------------------------------------------------- control loop


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

    def infer(self, obs: np.ndarray) -> np.ndarray:
        """Shape: (obs_dim,) float32 -> (act_dim,)."""
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
    """Observations of the wrong type, dtype or shape, or holding NaN or inf."""
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


@dataclass
class ControlLoop:
    """Fixed-rate ``read -> infer -> apply`` against ``robot``.

    Step ``k`` of the grid starts at ``t0 + k * period`` and must finish by the next slot;
    deadlines are absolute, so timing errors never accumulate. The loop is single-threaded:
    an inference that returns after the deadline has its result discarded and the safe
    action applied at once. ``safe_action`` defaults to the last good action (zeros before
    the first); every applied action is clipped to the policy's action range.
    """

    policy: Policy
    robot: Robot
    rate_hz: float
    safe_action: np.ndarray | None = None
    _last_good: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.rate_hz > 0:
            raise ValueError(f"rate_hz must be positive (value: {self.rate_hz})")
        self._last_good = np.zeros(self.policy.act_dim, np.float32)
        if self.safe_action is not None:
            safe = np.asarray(self.safe_action, np.float32)
            if safe.shape != (self.policy.act_dim,) or not np.isfinite(safe).all():
                raise ValueError(f"safe_action must be {self.policy.act_dim} finite numbers")
            self.safe_action = self._clip(safe)

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

    def run(self, steps: int) -> LoopStats:
        """Run ``steps`` control steps at ``rate_hz`` and return what happened."""
        clock = time.perf_counter_ns
        period = round(1e9 / self.rate_hz)
        latencies = np.zeros(steps, np.int64)
        inferred = misses = holds = malformed = overruns = bad = skipped = 0
        start = clock()
        slot = 0
        for _ in range(steps):
            deadline = start + (slot + 1) * period
            obs = self.robot.read()
            action: np.ndarray | None = None
            late = False
            if self._valid(obs):
                t0 = clock()
                out = self.policy.infer(np.asarray(obs, np.float32))
                t1 = clock()
                latencies[inferred] = t1 - t0
                inferred += 1
                late = t1 > deadline
                if late:
                    overruns += 1
                elif out.shape == (self.policy.act_dim,) and np.isfinite(out).all():
                    action = self._clip(out)
                else:
                    bad += 1
            else:
                malformed += 1
            if action is None:
                holds += 1
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
        us = latencies[:inferred].astype(np.float64) / 1e3
        p50, p99, top = np.percentile(us, [50, 99, 100]) if inferred else (0.0, 0.0, 0.0)
        return LoopStats(
            steps=steps,
            deadline_misses=misses,
            safe_holds=holds,
            malformed_inputs=malformed,
            inference_overruns=overruns,
            bad_outputs=bad,
            skipped_periods=skipped,
            latency_p50_us=float(p50),
            latency_p99_us=float(p99),
            latency_max_us=float(top),
            elapsed_s=elapsed,
        )


def _sleep_until(target_ns: int, clock: Any) -> None:
    """Sleep until ``_SPIN_NS`` before ``target_ns``, then spin to it."""
    remaining = target_ns - clock()
    if remaining > _SPIN_NS:
        time.sleep((remaining - _SPIN_NS) / 1e9)
    while clock() < target_ns:
        pass
