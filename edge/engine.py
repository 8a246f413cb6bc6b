"""On-target TensorRT engine build: from an unpacked bundle to a checked, timed engine and a report.

TensorRT engines are specific to a GPU and a TensorRT release, so the engine is built on the
robot computer itself (the ``jetson`` work pool) from the bundle's ONNX model, then checked
against ONNX Runtime on the bundle's calibration observations and timed at batch 1. The result
is ``policy.<precision>.engine`` beside ``engine_report.json``, whose fields MLflow records as an
external model (``flows engine report``).

This module is copied into every bundle as ``engine.py`` and runs on the target alone, so it
imports only the standard library and numpy at module level; ``tensorrt``, ``polygraphy`` and
``onnxruntime`` are imported inside the functions that need them. On the target::

    python3 engine.py BUNDLE_DIR [--precision int8] [--builder trtexec] [--out DIR]

Two builders: ``python`` (the TensorRT Python API through Polygraphy's loaders; INT8 calibrates
from ``calibration/obs.npy``, with a policy that sees also from each camera's frames
``calibration/<camera>_image.npy``, and writes a calibration cache) and ``trtexec`` (the
command from :func:`trtexec_command`; INT8 needs the cache a ``python`` build left). Polygraphy's
``TrtRunner`` runs the engine for the parity check and the timing;
:func:`edge.polygraphy_check.polygraphy_command` is the equivalent ``polygraphy run``
comparison for a person to repeat by hand.

A policy that sees has one uint8 input per camera, ``<camera>_image`` (batch, H, W, 3), beside
``obs``: the manifest's ``io.images`` gives their shapes, every input is bound by name in the
optimisation profile, the commands, the check and the timing, and each calibration batch is
a mapping of every input's rows.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST_NAME = "manifest.json"
MODEL_NAME = "policy.onnx"
CALIBRATION_NAME = "calibration/obs.npy"
REPORT_NAME = "engine_report.json"
INPUT_NAME = "obs"
OUTPUT_NAME = "actions"
IMAGE_SUFFIX = "_image"
REPORT_FORMAT = 1

BUILDERS = ("python", "trtexec")
PRECISION_TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 5e-2, "int8": 0.15}
"""Largest |TensorRT - ONNX Runtime| action difference accepted per engine precision (actions
lie in [-1, 1]). The package stage writes these into the manifest; the check reads them there."""

CALIBRATION_SAMPLES = 1024
"""Observations drawn from the training data for INT8 calibration and the engine check."""
CALIBRATION_BATCH = 64
MAX_BATCH = 64
"""Largest batch of the engine's optimisation profile (batch 1 is the optimum)."""
WORKSPACE_MIB = 256
MAX_MANIFEST_BYTES = 16 << 20
"""Largest manifest read (the runtime's bound: a manifest is a few KiB)."""
LATENCY_ITERS = 2000

_CU_DEVICE_ATTRIBUTE_CC_MAJOR = 75
_CU_DEVICE_ATTRIBUTE_CC_MINOR = 76


class EngineBuildError(Exception):
    """A bundle, machine or engine the build step refuses; the message is one line."""


def _fail(where: Path | str, problem: str) -> EngineBuildError:
    return EngineBuildError(" ".join(f"{where}: {problem}".split()))


# --------------------------------------------------------------------------- calibration set

Inputs = Mapping[str, np.ndarray]
"""A policy's inputs by name: ``obs`` (N, obs_dim) float32 and each ``<camera>_image``
(N, H, W, 3) uint8, row i of each one sample."""


def calibration_member(name: str) -> str:
    """The bundle member holding input ``name``'s calibration samples: ``calibration/<name>.npy``
    (``calibration/obs.npy`` for the state, :data:`CALIBRATION_NAME`)."""
    return f"calibration/{name}.npy"


def calibration_arrays(calibration: np.ndarray | Inputs) -> dict[str, np.ndarray]:
    """Every input's calibration samples, ``obs`` first, as contiguous arrays: the state as
    float32, the images as uint8. A bare array is the state alone. Refused (ValueError): no
    ``obs``, a name that is neither ``obs`` nor ``<camera>_image``, an image that is not
    uint8 (N, H, W, 3), inputs of different sample counts."""
    given = dict(calibration) if isinstance(calibration, Mapping) else {INPUT_NAME: calibration}
    if INPUT_NAME not in given:
        raise ValueError(f"calibration inputs must hold {INPUT_NAME!r} (value: {sorted(given)})")
    arrays = {INPUT_NAME: np.ascontiguousarray(given.pop(INPUT_NAME), dtype=np.float32)}
    for name, value in given.items():
        image = np.asarray(value)
        if not name.endswith(IMAGE_SUFFIX) or image.dtype != np.uint8 or image.ndim != 4 \
                or image.shape[-1] != 3:
            raise ValueError(f"calibration input {name!r} must be a camera image "
                             f"'<camera>{IMAGE_SUFFIX}' of uint8 (N, H, W, 3) (value: "
                             f"{image.dtype} {image.shape})")
        arrays[name] = np.ascontiguousarray(image)
    counts = {name: len(array) for name, array in arrays.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(f"calibration inputs must hold as many samples each (value: {counts})")
    return arrays


def calibration_batches(
    obs: np.ndarray | Inputs, batch: int = CALIBRATION_BATCH
) -> Iterator[dict[str, Any]]:
    """Feed dicts of at most ``batch`` rows covering the samples in order: the data loader of
    an INT8 calibrator. ``obs`` is the state alone (``{"obs": rows}``, float32) or, for a
    policy that sees, every input by name (``{"obs": rows, "<camera>_image": frames}``, the
    frames uint8 (rows, H, W, 3))."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1 (value: {batch})")
    if isinstance(obs, Mapping):
        arrays = calibration_arrays(obs)
        for start in range(0, len(arrays[INPUT_NAME]), batch):
            yield {name: array[start:start + batch] for name, array in arrays.items()}
        return
    for start in range(0, len(obs), batch):
        yield {INPUT_NAME: np.ascontiguousarray(obs[start:start + batch], dtype=np.float32)}


def load_calibration(plan: BuildPlan) -> dict[str, np.ndarray]:
    """The plan's calibration samples of every input by name, read from the bundle's members."""
    files = plan.calibration_inputs or {INPUT_NAME: plan.calibration}
    return calibration_arrays({name: np.load(path, allow_pickle=False)
                               for name, path in files.items()})


# --------------------------------------------------------------------------- the plan


def tolerance_problem(tolerances: object) -> str | None:
    """Why a manifest's ``engine.tolerances`` may not bound an engine check, or None: each
    must be a finite number above 0 and at most the bound for its precision
    (:data:`PRECISION_TOLERANCE`); a bundle can tighten a check, never loosen it."""
    if not isinstance(tolerances, dict):
        return f"field 'engine.tolerances' must be an object (value: {str(tolerances)[:80]!r})"
    for precision, value in tolerances.items():
        field = f"field 'engine.tolerances.{precision}'"
        bound = PRECISION_TOLERANCE.get(precision)
        if bound is None:
            return f"{field}: unknown precision (valid: {', '.join(PRECISION_TOLERANCE)})"
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value <= 0):
            return f"{field} must be a finite number above 0 (value: {str(value)[:40]!r})"
        if value > bound:
            return (f"{field} is looser than the {bound:g} allowed for {precision} engines "
                    f"(value: {value!r})")
    return None


@dataclass(frozen=True)
class BuildPlan:
    """Everything one engine build needs, read and checked from an unpacked bundle."""

    bundle_dir: Path
    onnx: Path
    engine: Path
    report: Path
    calibration: Path
    calibration_cache: Path
    timing_cache: Path
    precision: str
    builder: str
    obs_dim: int
    act_dim: int
    max_batch: int
    workspace_mib: int
    tolerance: float
    target: dict[str, Any]
    manifest_sha256: str
    onnx_sha256: str
    lineage: dict[str, Any]
    control_hz: float
    latency_budget_ms: float
    images: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Image input name -> one frame's (height, width, 3), uint8; empty for a state policy."""
    calibration_inputs: dict[str, Path] = field(default_factory=dict)
    """Every input's calibration file, ``obs`` first, for a policy that sees; empty for a
    state policy (whose calibration set is :attr:`calibration`)."""

    def input_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        """Every input's shape at ``batch``: ``obs`` (batch, obs_dim), images (batch, H, W, 3)."""
        return {INPUT_NAME: (batch, self.obs_dim),
                **{name: (batch, *shape) for name, shape in self.images.items()}}


def _read_manifest(manifest_path: Path) -> tuple[dict[str, Any], bytes]:
    """The manifest's JSON object and its bytes, read no further than
    :data:`MAX_MANIFEST_BYTES`."""
    with open(manifest_path, "rb") as file:
        raw = file.read(MAX_MANIFEST_BYTES + 1)
    try:
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ValueError(f"{MANIFEST_NAME} is larger than {MAX_MANIFEST_BYTES:,} bytes")
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _fail(manifest_path, f"not a JSON manifest: {exc!r}") from None
    if not isinstance(manifest, dict):
        raise _fail(manifest_path, "not a JSON object")
    return manifest, raw


def _refuse_diffusion(manifest_path: Path, manifest: dict[str, Any]) -> None:
    """Refuse a diffusion policy's bundle (its manifest's ``io.diffusion``): it runs on ONNX
    Runtime with its denoising loop in the graph, and its engine path is not built."""
    if isinstance(manifest.get("io"), dict) and "diffusion" in manifest["io"]:
        raise _fail(manifest_path, "a diffusion policy's bundle (field 'io.diffusion') runs on "
                                   "ONNX Runtime with its denoising loop in the graph; no "
                                   "TensorRT engine is built for it")


def plan_build(
    bundle_dir: Path,
    *,
    precision: str | None = None,
    builder: str = "python",
    out_dir: Path | None = None,
    max_batch: int = MAX_BATCH,
    workspace_mib: int = WORKSPACE_MIB,
) -> BuildPlan:
    """Read the unpacked bundle at ``bundle_dir`` and check that it can be built as asked.

    ``precision`` defaults to the manifest's. Refused: a missing manifest, model or
    calibration set; a precision or opset the manifest's target does not take; an INT8
    ``trtexec`` build without a calibration cache; a diffusion policy's bundle. Outputs go to
    ``out_dir`` (default ``bundle_dir``). Nothing is written.
    """
    bundle_dir = Path(bundle_dir)
    manifest_path = bundle_dir / MANIFEST_NAME
    if not manifest_path.is_file():
        raise _fail(bundle_dir, f"not an unpacked bundle: {MANIFEST_NAME} not found")
    manifest, raw = _read_manifest(manifest_path)
    _refuse_diffusion(manifest_path, manifest)
    try:
        target = manifest["target"]
        obs_dim = int(manifest["io"]["obs"]["shape"][-1])
        act_dim = int(manifest["io"]["actions"]["shape"][-1])
        opset = int(manifest["opset"])
        files = manifest["files"]
        tolerances = manifest.get("engine", {}).get("tolerances", PRECISION_TOLERANCE)
        supported = list(target["precisions"])
        control_hz = float(manifest["control_hz"])
        budget_ms = float(manifest["latency_budget_ms"])
        images = {str(e["name"]): (int(e["shape"][1]), int(e["shape"][2]), int(e["shape"][3]))
                  for e in manifest["io"].get("images", [])}
        calibration = dict(manifest["engine"]["calibration"].get("inputs", {})) if images \
            else {}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise _fail(manifest_path, f"bad or missing field: {exc!r}") from None
    precision = precision or str(manifest.get("precision"))
    _check_precision(manifest_path, tolerances, builder, precision, supported, target, opset)
    if images and sorted(calibration) != sorted([INPUT_NAME, *images]):
        raise _fail(manifest_path, f"field 'engine.calibration.inputs' must list every input "
                                   f"{[INPUT_NAME, *images]} (value: {sorted(calibration)})")
    for name in (MODEL_NAME, CALIBRATION_NAME, *calibration.values()):
        if name not in files or not (bundle_dir / name).is_file():
            raise _fail(bundle_dir, f"member {name!r} missing from the unpacked bundle")
    if max_batch < 1 or workspace_mib < 1:
        raise _fail(bundle_dir, f"max_batch and workspace_mib must be positive "
                                f"(values: {max_batch}, {workspace_mib})")
    out = Path(out_dir) if out_dir is not None else bundle_dir
    plan = BuildPlan(
        bundle_dir=bundle_dir,
        onnx=bundle_dir / MODEL_NAME,
        engine=out / f"policy.{precision}.engine",
        report=out / REPORT_NAME,
        calibration=bundle_dir / CALIBRATION_NAME,
        calibration_cache=out / "calibration.cache",
        timing_cache=out / "timing.cache",
        precision=precision,
        builder=builder,
        obs_dim=obs_dim,
        act_dim=act_dim,
        max_batch=max_batch,
        workspace_mib=workspace_mib,
        tolerance=float(tolerances[precision]),
        target=dict(target),
        manifest_sha256=sha256(raw).hexdigest(),
        onnx_sha256=files[MODEL_NAME]["sha256"],
        lineage=dict(manifest.get("lineage", {})),
        control_hz=control_hz,
        latency_budget_ms=budget_ms,
        images=images,
        calibration_inputs={name: bundle_dir / calibration[name]
                            for name in (INPUT_NAME, *images)} if images else {},
    )
    if builder == "trtexec" and precision == "int8" and not plan.calibration_cache.is_file():
        raise _fail(plan.calibration_cache, "an INT8 trtexec build needs this calibration "
                                            "cache; build once with --builder python first")
    return plan


def _check_precision(manifest_path: Path, tolerances: Any, builder: str, precision: str,
                     supported: list[str], target: dict[str, Any], opset: int) -> None:
    """Refuse a builder, precision or opset the bundle's target does not take, and engine
    tolerances looser than their precision's bound."""
    problem = tolerance_problem(tolerances)
    if problem:
        raise _fail(manifest_path, problem)
    if builder not in BUILDERS:
        raise _fail(manifest_path, f"builder must be one of {', '.join(BUILDERS)} (value: "
                                   f"{builder!r})")
    if precision not in PRECISION_TOLERANCE or precision not in tolerances:
        raise _fail(manifest_path, f"precision must be one of "
                                   f"{', '.join(PRECISION_TOLERANCE)} (value: {precision!r})")
    if precision not in supported:
        raise _fail(manifest_path, f"target {target.get('name')!r} supports precisions "
                                   f"{', '.join(supported)} (value: {precision!r})")
    if opset > int(target.get("max_onnx_opset", opset)):
        raise _fail(manifest_path, f"field 'opset': TensorRT {target.get('tensorrt')} parses "
                                   f"opsets up to {target.get('max_onnx_opset')} (value: {opset})")


# --------------------------------------------------------------------------- commands


def profile_shapes(plan: BuildPlan, sep: str, fmt: str) -> tuple[list[str], list[str], list[str]]:
    """The optimisation profile (min, opt, max) of every input in one tool's shape syntax:
    ``fmt`` formats one input from its name ``n`` and dimensions ``d`` joined by ``sep``."""
    low, opt, high = ([fmt.format(n=name, d=sep.join(map(str, dims)))
                       for name, dims in plan.input_shapes(b).items()]
                      for b in (1, 1, plan.max_batch))
    return low, opt, high


def precision_flags(precision: str) -> list[str]:
    """trtexec and polygraphy spell the precision flags alike; INT8 keeps FP16 as a fallback."""
    return {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"],
            "int8": ["--int8", "--fp16"]}[precision]


def trtexec_command(plan: BuildPlan, trtexec: str = "trtexec") -> list[str]:
    """The ``trtexec`` command that builds ``plan.engine`` from ``plan.onnx``."""
    low, opt, high = (",".join(shapes) for shapes in profile_shapes(plan, "x", "{n}:{d}"))
    cmd = [
        trtexec,
        f"--onnx={plan.onnx}",
        f"--saveEngine={plan.engine}",
        f"--minShapes={low}",
        f"--optShapes={opt}",
        f"--maxShapes={high}",
        f"--memPoolSize=workspace:{plan.workspace_mib}M",
        f"--timingCacheFile={plan.timing_cache}",
        "--skipInference",
        *precision_flags(plan.precision),
    ]
    if plan.precision == "int8":
        cmd.append(f"--calib={plan.calibration_cache}")
    return cmd


# --------------------------------------------------------------------------- machine


def tensorrt_version() -> str:
    """The importable TensorRT's version; refuses, in one line, a machine without it."""
    try:
        import tensorrt
    except ImportError as exc:
        raise EngineBuildError(
            f"TensorRT is not installed on this machine (import tensorrt: {exc}); the engine "
            "is built on the target: run this on the Jetson (the 'jetson' work pool) or in the "
            "bundle's container"
        ) from None
    return str(tensorrt.__version__)


def gpu_info() -> tuple[str, str]:
    """Name and compute capability (``sm_XY``) of CUDA device 0, from the CUDA driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise EngineBuildError(f"no CUDA driver on this machine (libcuda.so.1: {exc})") from None
    device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    name = ctypes.create_string_buffer(256)
    calls = (
        ("cuInit", (0,)),
        ("cuDeviceGet", (ctypes.byref(device), 0)),
        ("cuDeviceGetName", (name, 256, device)),
        ("cuDeviceGetAttribute", (ctypes.byref(major), _CU_DEVICE_ATTRIBUTE_CC_MAJOR, device)),
        ("cuDeviceGetAttribute", (ctypes.byref(minor), _CU_DEVICE_ATTRIBUTE_CC_MINOR, device)),
    )
    for fn, args in calls:
        status = getattr(cuda, fn)(*args)
        if status != 0:
            raise EngineBuildError(f"CUDA driver call {fn} failed with status {status}")
    return name.value.decode(errors="replace"), f"sm_{major.value}{minor.value}"


# --------------------------------------------------------------------------- build and check


def build_engine(plan: BuildPlan) -> list[str]:
    """Build ``plan.engine`` with the plan's builder; return the command it amounts to."""
    plan.engine.parent.mkdir(parents=True, exist_ok=True)
    if plan.builder == "trtexec":
        exe = shutil.which("trtexec") or "/usr/src/tensorrt/bin/trtexec"
        if not Path(exe).is_file():
            raise EngineBuildError("trtexec not found on PATH or in /usr/src/tensorrt/bin")
        cmd = trtexec_command(plan, exe)
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["(no output)"]
            raise _fail(plan.onnx, f"trtexec exited {done.returncode}: {tail[0]}")
        return cmd
    from polygraphy.backend.trt import (
        Calibrator,
        CreateConfig,
        EngineFromNetwork,
        NetworkFromOnnxPath,
        Profile,
        save_engine,
    )

    profile = Profile()
    low, high = plan.input_shapes(1), plan.input_shapes(plan.max_batch)
    for name in low:
        profile.add(name, min=low[name], opt=low[name], max=high[name])
    calibrator = None
    if plan.precision == "int8":
        calibrator = Calibrator(data_loader=calibration_batches(load_calibration(plan)),
                                cache=str(plan.calibration_cache))
    config = CreateConfig(
        fp16=plan.precision in ("fp16", "int8"),
        bf16=plan.precision == "bf16",
        int8=plan.precision == "int8",
        profiles=[profile],
        calibrator=calibrator,
        load_timing_cache=str(plan.timing_cache) if plan.timing_cache.is_file() else None,
        memory_pool_limits={"workspace": plan.workspace_mib << 20},
    )
    engine = EngineFromNetwork(NetworkFromOnnxPath(str(plan.onnx)), config=config,
                               save_timing_cache=str(plan.timing_cache))()
    save_engine(engine, path=str(plan.engine))
    return trtexec_command(plan)


@dataclass(frozen=True)
class EngineCheck:
    """TensorRT against ONNX Runtime on the calibration observations, and batch-1 timing."""

    samples: int
    max_abs_diff: float
    tolerance: float
    passed: bool
    latency_p50_us: float
    latency_p99_us: float
    latency_iters: int


def check_engine(plan: BuildPlan, iters: int = LATENCY_ITERS) -> EngineCheck:
    """Run the engine and ONNX Runtime (CPU) on the calibration set; time the engine at batch 1.

    Every input is fed by name (a policy that sees gets its calibration frames, uint8). Timing
    covers one ``TrtRunner.infer`` call on the first sample: host-to-device copies, execution
    and copy back, which is what the control loop pays per step.
    """
    import onnxruntime
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    inputs = load_calibration(plan)
    ort = onnxruntime.InferenceSession(str(plan.onnx), providers=["CPUExecutionProvider"])
    diff = 0.0
    with TrtRunner(EngineFromBytes(BytesFromPath(str(plan.engine)))) as runner:
        for feed in calibration_batches(inputs, plan.max_batch):
            got = np.asarray(runner.infer(feed)[OUTPUT_NAME], np.float32)
            want = ort.run([OUTPUT_NAME], feed)[0]
            step = np.abs(got - want)
            diff = max(diff, float(step.max()) if np.isfinite(step).all() else float("inf"))
        one = {name: array[:1] for name, array in inputs.items()}
        times = np.empty(iters, np.int64)
        for i in range(iters):
            t0 = time.perf_counter_ns()
            runner.infer(one)
            times[i] = time.perf_counter_ns() - t0
    p50, p99 = np.percentile(times / 1e3, [50, 99])
    return EngineCheck(samples=len(inputs[INPUT_NAME]), max_abs_diff=diff, tolerance=plan.tolerance,
                       passed=diff <= plan.tolerance, latency_p50_us=float(p50),
                       latency_p99_us=float(p99), latency_iters=iters)


def engine_report(
    plan: BuildPlan,
    check: EngineCheck,
    *,
    engine_sha256: str,
    engine_bytes: int,
    tensorrt: str,
    gpu: str,
    compute_capability: str,
    build_seconds: float,
    command: Sequence[str],
) -> dict[str, Any]:
    """The JSON-ready record of one engine build: what was built, where, and how it checked."""
    within = check.latency_p99_us / 1000 <= plan.latency_budget_ms
    return {
        "format": REPORT_FORMAT,
        "engine_sha256": engine_sha256,
        "engine_bytes": engine_bytes,
        "precision": plan.precision,
        "builder": plan.builder,
        "build_seconds": round(build_seconds, 3),
        "command": shlex.join(command),
        "tensorrt": tensorrt,
        "gpu": gpu,
        "compute_capability": compute_capability,
        "target": plan.target.get("name"),
        "target_gpu_arch": plan.target.get("gpu_arch"),
        "target_tensorrt": plan.target.get("tensorrt"),
        "onnx_sha256": plan.onnx_sha256,
        "manifest_sha256": plan.manifest_sha256,
        "lineage": plan.lineage,
        "check": asdict(check),
        "control_hz": plan.control_hz,
        "latency_budget_ms": plan.latency_budget_ms,
        "within_budget": within,
        "passed": check.passed and within,
    }


def run(plan: BuildPlan, *, any_gpu: bool = False, iters: int = LATENCY_ITERS) -> dict[str, Any]:
    """Build, check and time the engine of ``plan``; write and return its report.

    Refuses a machine without TensorRT or a CUDA driver, and, unless ``any_gpu``, a GPU whose
    architecture is not the bundle's target's (an engine runs only where it was built).
    """
    version = tensorrt_version()
    gpu, cc = gpu_info()
    wanted = plan.target.get("gpu_arch")
    if cc != wanted and not any_gpu:
        raise EngineBuildError(
            f"this GPU ({gpu}, {cc}) is not the bundle's target {plan.target.get('name')!r} "
            f"({wanted}); pass --any-gpu to build a test engine anyway"
        )
    start = time.perf_counter()
    command = build_engine(plan)
    seconds = time.perf_counter() - start
    check = check_engine(plan, iters)
    data = plan.engine.read_bytes()
    report = engine_report(plan, check, engine_sha256=sha256(data).hexdigest(),
                           engine_bytes=len(data), tensorrt=version, gpu=gpu,
                           compute_capability=cc, build_seconds=seconds, command=command)
    tmp = plan.report.with_name(plan.report.name + ".partial")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    tmp.replace(plan.report)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Command line on the target: build, check and time the engine of an unpacked bundle."""
    parser = argparse.ArgumentParser(prog="engine.py", description=__doc__.splitlines()[0])
    parser.add_argument("bundle_dir", type=Path, help="folder of an unpacked, verified bundle")
    parser.add_argument("--precision", choices=sorted(PRECISION_TOLERANCE),
                        help="engine precision (default: the manifest's)")
    parser.add_argument("--builder", choices=BUILDERS, default="python")
    parser.add_argument("--out", type=Path, help="output folder (default: the bundle folder)")
    parser.add_argument("--any-gpu", action="store_true",
                        help="build even on a GPU that is not the bundle's target")
    parser.add_argument("--iters", type=int, default=LATENCY_ITERS, help="timing iterations")
    args = parser.parse_args(argv)
    try:
        plan = plan_build(args.bundle_dir, precision=args.precision, builder=args.builder,
                          out_dir=args.out)
        report = run(plan, any_gpu=args.any_gpu, iters=args.iters)
    except EngineBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    check = report["check"]
    print(f"{plan.engine}: {report['precision']} engine, TensorRT {report['tensorrt']} on "
          f"{report['gpu']} ({report['compute_capability']}); max |TRT - ORT| "
          f"{check['max_abs_diff']:.2e} (tolerance {check['tolerance']:g}); batch-1 p99 "
          f"{check['latency_p99_us']:.0f} us (budget {report['latency_budget_ms']:g} ms); "
          f"{'PASSED' if report['passed'] else 'FAILED'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
