"""Batch-1 latency of a bundled policy through the on-robot runtime, against torch eager.

The policy is the reach-shaped MLP (23 -> 256 x 256 -> 7, ELU, tanh output, the observation
normalizer inside) built by :func:`stages.policies.local.build_policy`, exported with
:func:`edge.export.export_onnx`, packed with :func:`edge.bundle.write_bundle`, then loaded and
verified by :func:`edge.runtime.load_bundle` on ONNX Runtime's CPU provider. Each timed call is
:meth:`edge.runtime.LoadedPolicy.infer` on one observation, the call the control loop makes;
torch eager is timed with :func:`edge.bench.torch_latency`, both on one thread. Targets: the
runtime's p99 at most half of torch's, and within a 500 Hz loop's 2 ms period.

The runtime's own cost per step is measured against a bare ``onnxruntime.InferenceSession.run``
on the same model file and observation, with the same session options (one thread, sequential,
all graph optimizations), the two calls alternating in one loop so both see the same machine.
Target: the runtime's p99 at most 1.25x the bare session's.

Then the runtime's :class:`edge.runtime.ControlLoop` runs the bundle at 500 Hz for
``--loop-seconds`` (10 s) against a MuJoCo robot: the reach-v0 arm in its nominal scene
(:class:`stages.evaluation.robot.SimRobot`, one control period of simulation per loop step). Target:
at most 0.1% of steps miss their deadline; every miss is counted and reported.

A policy that sees is measured the same way: reach-vision-v0's vision policy as
``configs/reach_vision.yaml`` trains it (:func:`stages.policies.vision.build_vision_policy`: the
17-entry state and the front camera's 64 x 64 RGB frame, encoder channels 16, 32, 32, MLP 256 x
256), exported with its uint8 image input and packed as a bundle whose manifest names it. The
runtime's ``infer(obs, {"front_image": frame})`` and a bare ``InferenceSession.run`` on the same
state and frame alternate in one loop; target: the runtime's p99 at most 1.25x the bare
session's. Its control loop then runs ``--vision-loop-seconds`` (4 s) at the task's 25 Hz
against the reach-vision-v0 arm, the frames rendered by the task's camera each step (MuJoCo
offscreen) and taken from the loop's camera callable.
Prints one JSON line.

    python benchmarks/edge_latency.py [--iters 5000] [--warmup 500] [--loop-seconds 10]
                                      [--vision-loop-seconds 4]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edge.bench import torch_latency
from edge.bundle import write_bundle
from edge.export import export_onnx
from edge.runtime import ControlLoop, LoadedPolicy, LoopStats, load_bundle
from stages.policies.local import build_policy

OBS_DIM, ACT_DIM, HIDDEN = 23, 7, (256, 256)
VISION_TASK, VISION_HZ, ENCODER = "reach-vision-v0", 25.0, (16, 32, 32)
LOOP_HZ = 500.0
RATIO_TARGET = 0.5
OVERHEAD_TARGET = 1.25
MISS_TARGET = 0.001
ROOT = Path(__file__).resolve().parents[1]


def run_loop(policy: LoadedPolicy, seconds: float) -> LoopStats:
    """The control loop at LOOP_HZ for ``seconds`` against the reach-v0 arm."""
    from stages.evaluation.robot import SimRobot
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.catalog import get_task

    scene = load_scene(ROOT / "sim_scenes" / "reach" / "nominal.yaml")
    env = get_task(scene.config.task).make_env(scene, 1, 0, num_threads=1)
    ControlLoop(policy, SimRobot(env), LOOP_HZ).run(int(LOOP_HZ))  # warm-up second
    return ControlLoop(policy, SimRobot(env), LOOP_HZ).run(int(seconds * LOOP_HZ))


def bare_session(model: Path) -> object:
    """An ONNX Runtime CPU session on ``model`` with the runtime's options, nothing around it."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def alternating(policy: LoadedPolicy, session: object, obs: np.ndarray, iters: int,
                warmup: int, frames: Mapping[str, np.ndarray] | None = None,
                ) -> tuple[np.ndarray, np.ndarray]:
    """Latencies (ns) of ``policy.infer(obs)`` (with a policy that sees, ``infer(obs,
    frames)``) and of the bare ``session.run`` on the same observation and frames, one call of
    each per iteration."""
    run = session.run  # type: ignore[attr-defined]
    feed = {"obs": obs.reshape(1, -1)} | {k: v[None] for k, v in (frames or {}).items()}

    def infer() -> None:
        if frames:
            policy.infer(obs, frames)
        else:
            policy.infer(obs)

    for _ in range(warmup):
        infer()
        run(["actions"], feed)
    runtime, bare = np.empty(iters, np.int64), np.empty(iters, np.int64)
    clock = time.perf_counter_ns
    for i in range(iters):
        start = clock()
        infer()
        middle = clock()
        run(["actions"], feed)
        runtime[i], bare[i] = middle - start, clock() - middle
    return runtime, bare


def percentiles(samples_ns: np.ndarray) -> tuple[float, float]:
    """p50 and p99 of per-call nanoseconds, in microseconds."""
    p50, p99 = np.percentile(samples_ns.astype(np.float64) / 1e3, [50, 99])
    return float(p50), float(p99)


def vision_bundle(work: Path) -> tuple[Path, Path, dict[str, tuple[int, int, int]]]:
    """reach-vision-v0's vision policy exported and packed (unsigned) under ``work``: the
    bundle, its ONNX file and its image inputs (name -> (H, W, 3))."""
    from stages.policies.vision import build_vision_policy
    from stages.sim.tasks.catalog import get_task

    spec = get_task(VISION_TASK)
    images = {cam.image_key: (cam.height, cam.width, 3) for cam in spec.cameras}
    rng = np.random.default_rng(1)
    module = build_vision_policy(spec.obs_dim, spec.act_dim, HIDDEN, list(images.items()),
                                 rng.uniform(-1, 1, spec.obs_dim).astype(np.float32),
                                 rng.uniform(0.1, 2, spec.obs_dim).astype(np.float32), ENCODER)
    onnx_path = export_onnx(module, spec.obs_dim, work / "vision.onnx", images=images)
    manifest = {
        "task": VISION_TASK,
        "io": {
            "obs": {"name": "obs", "shape": ["batch", spec.obs_dim], "dtype": "float32"},
            "actions": {"name": "actions", "shape": ["batch", spec.act_dim],
                        "dtype": "float32", "range": [-1.0, 1.0]},
            "images": [{"name": key, "shape": ["batch", *shape], "dtype": "uint8",
                        "layout": "HWC", "channels": "RGB", "camera": key.removesuffix("_image")}
                       for key, shape in images.items()],
        },
        "control_hz": VISION_HZ,
        "latency_budget_ms": 1000.0 / VISION_HZ,
        "target": {"name": "cpu-benchmark"},
    }
    write_bundle(work / "vision.tar", {"policy.onnx": onnx_path}, manifest)
    return work / "vision.tar", onnx_path, images


def run_vision(iters: int, warmup: int, loop_seconds: float) -> dict[str, Any]:
    """The vision bundle's runtime p50/p99 against a bare session on the same state and frame
    (random pixels of the camera's size), and its control loop at the task's rate against the
    reach-vision-v0 arm with rendered frames; the JSON fields of the report."""
    from stages.evaluation.robot import SimRobot
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.catalog import get_task

    with tempfile.TemporaryDirectory(prefix="edge-latency-vision-") as scratch:
        work = Path(scratch)
        bundle, onnx_path, images = vision_bundle(work)
        policy = load_bundle(bundle, work / "run", providers=["CPUExecutionProvider"],
                             allow_unsigned=True)  # the benchmark's own bundle, unsigned
        rng = np.random.default_rng(2)
        obs = rng.standard_normal(policy.obs_dim).astype(np.float32)
        frames = {k: rng.integers(0, 256, shape, dtype=np.uint8) for k, shape in images.items()}
        runtime, bare = alternating(policy, bare_session(onnx_path), obs, iters, warmup, frames)
        scene = load_scene(ROOT / "sim_scenes" / "reach_vision" / "nominal.yaml")
        robot = SimRobot(get_task(VISION_TASK).make_env(scene, 1, 0, num_threads=1))
        loop = ControlLoop(policy, robot, VISION_HZ, cameras=robot.frames).run(
            max(1, int(loop_seconds * VISION_HZ)))
    (p50, p99), (bare_p50, bare_p99) = percentiles(runtime), percentiles(bare)
    overhead = p99 / bare_p99
    seen = " + ".join(f"{k} {'x'.join(map(str, shape))} uint8" for k, shape in images.items())
    return {
        "vision_policy": f"{policy.obs_dim} + {seen} -> conv {'x'.join(map(str, ENCODER))} "
                         f"-> {'x'.join(map(str, HIDDEN))} -> {policy.act_dim}",
        "vision_runtime_p50_us": round(p50, 2),
        "vision_runtime_p99_us": round(p99, 2),
        "vision_bare_session_p50_us": round(bare_p50, 2),
        "vision_bare_session_p99_us": round(bare_p99, 2),
        "vision_runtime_overhead_p99": round(overhead, 3),
        "vision_overhead_ok": overhead <= OVERHEAD_TARGET,
        "vision_budget_us": 1e6 / VISION_HZ,
        "vision_fits_budget": p99 <= 1e6 / VISION_HZ,
        "vision_loop_hz": VISION_HZ,
        "vision_loop_steps": loop.steps,
        "vision_loop_deadline_misses": loop.deadline_misses,
        "vision_loop_malformed_inputs": loop.malformed_inputs,
        "vision_loop_inference_p99_us": round(loop.latency_p99_us, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--loop-seconds", type=float, default=10.0)
    parser.add_argument("--vision-loop-seconds", type=float, default=4.0)
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    mean = rng.uniform(-1.0, 1.0, OBS_DIM).astype(np.float32)
    std = rng.uniform(0.1, 2.0, OBS_DIM).astype(np.float32)
    module = build_policy(OBS_DIM, ACT_DIM, HIDDEN, mean, std)
    with tempfile.TemporaryDirectory(prefix="edge-latency-") as scratch:
        work = Path(scratch)
        onnx_path = export_onnx(module, OBS_DIM, work / "policy.onnx")
        manifest = {
            "io": {
                "obs": {"name": "obs", "shape": ["batch", OBS_DIM], "dtype": "float32"},
                "actions": {"name": "actions", "shape": ["batch", ACT_DIM], "dtype": "float32",
                            "range": [-1.0, 1.0]},
            },
            "control_hz": LOOP_HZ,
            "latency_budget_ms": 1000.0 / LOOP_HZ,
            "target": {"name": "cpu-benchmark"},
        }
        write_bundle(work / "bundle.tar", {"policy.onnx": onnx_path}, manifest)
        policy = load_bundle(
            work / "bundle.tar", work / "run", providers=["CPUExecutionProvider"],
            allow_unsigned=True,  # the benchmark's own bundle, written unsigned above
        )
        obs = rng.standard_normal(OBS_DIM).astype(np.float32)
        samples, bare_samples = alternating(policy, bare_session(onnx_path), obs, args.iters,
                                            args.warmup)
        loop = run_loop(policy, args.loop_seconds)
    us = samples.astype(np.float64) / 1e3
    p50, p99 = (float(v) for v in np.percentile(us, [50, 99]))
    bare_p50, bare_p99 = (float(v) for v in np.percentile(bare_samples / 1e3, [50, 99]))
    overhead = p99 / bare_p99
    eager = torch_latency(module, OBS_DIM, iters=args.iters, warmup=args.warmup, threads=1)
    vision = run_vision(args.iters, args.warmup, args.vision_loop_seconds)
    budget_us = 1e6 / LOOP_HZ
    ratio = p99 / eager.p99_us
    print(
        json.dumps(
            {
                "benchmark": "edge_latency",
                "policy": f"{OBS_DIM}->{'x'.join(map(str, HIDDEN))}->{ACT_DIM}",
                "iters": args.iters,
                "runtime_provider": policy.provider,
                "runtime_p50_us": round(p50, 2),
                "runtime_p99_us": round(p99, 2),
                "bare_session_p50_us": round(bare_p50, 2),
                "bare_session_p99_us": round(bare_p99, 2),
                "runtime_overhead_p99": round(overhead, 3),
                "overhead_target": OVERHEAD_TARGET,
                "overhead_ok": overhead <= OVERHEAD_TARGET,
                "torch_eager_p50_us": round(eager.p50_us, 2),
                "torch_eager_p99_us": round(eager.p99_us, 2),
                "p99_ratio": round(ratio, 3),
                "ratio_target": RATIO_TARGET,
                "ratio_ok": ratio <= RATIO_TARGET,
                "loop_hz": LOOP_HZ,
                "budget_us": budget_us,
                "fits_500hz": p99 <= budget_us,
                "loop_seconds": round(loop.elapsed_s, 3),
                "loop_steps": loop.steps,
                "loop_deadline_misses": loop.deadline_misses,
                "loop_miss_fraction": round(loop.deadline_misses / loop.steps, 5),
                "loop_miss_target": MISS_TARGET,
                "loop_safe_holds": loop.safe_holds,
                "loop_skipped_periods": loop.skipped_periods,
                "loop_inference_p99_us": round(loop.latency_p99_us, 2),
                "loop_ok": loop.deadline_misses / loop.steps <= MISS_TARGET,
                **vision,
            }
        )
    )


if __name__ == "__main__":
    main()
