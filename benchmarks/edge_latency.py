"""Batch-1 latency of a bundled policy through the on-robot runtime, against torch eager.

The policy is the reach-shaped MLP (23 -> 256 x 256 -> 7, ELU, tanh output, the observation
normalizer inside) built by :func:`stages.policy.build_policy`, exported with
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
(:class:`stages.sim.robot.SimRobot`, one control period of simulation per loop step). Target:
at most 0.1% of steps miss their deadline; every miss is counted and reported.
Prints one JSON line.

    python benchmarks/edge_latency.py [--iters 5000] [--warmup 500] [--loop-seconds 10]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from edge.bench import torch_latency
from edge.bundle import write_bundle
from edge.export import export_onnx
from edge.runtime import ControlLoop, LoadedPolicy, LoopStats, load_bundle
from stages.policy import build_policy

OBS_DIM, ACT_DIM, HIDDEN = 23, 7, (256, 256)
LOOP_HZ = 500.0
RATIO_TARGET = 0.5
OVERHEAD_TARGET = 1.25
MISS_TARGET = 0.001
ROOT = Path(__file__).resolve().parents[1]


def run_loop(policy: LoadedPolicy, seconds: float) -> LoopStats:
    """The control loop at LOOP_HZ for ``seconds`` against the reach-v0 arm."""
    from stages.sim.robot import SimRobot
    from stages.sim.scene import load_scene
    from stages.sim.tasks import get_task

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
                warmup: int) -> tuple[np.ndarray, np.ndarray]:
    """Latencies (ns) of ``policy.infer(obs)`` and of the bare ``session.run`` on the same
    observation, one call of each per iteration."""
    run = session.run  # type: ignore[attr-defined]
    batch = obs.reshape(1, -1)
    for _ in range(warmup):
        policy.infer(obs)
        run(["actions"], {"obs": batch})
    runtime, bare = np.empty(iters, np.int64), np.empty(iters, np.int64)
    clock = time.perf_counter_ns
    for i in range(iters):
        start = clock()
        policy.infer(obs)
        middle = clock()
        run(["actions"], {"obs": batch})
        runtime[i], bare[i] = middle - start, clock() - middle
    return runtime, bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--loop-seconds", type=float, default=10.0)
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
            }
        )
    )


if __name__ == "__main__":
    main()
