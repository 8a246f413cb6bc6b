"""Single-observation inference latency of an ONNX policy and of its torch original.

Every input is timed at its real size: the state vector (1, obs_dim) and, for a policy that
sees, one frame of each image input (1, H, W, 3) uint8 at the graph's (the bundle manifest's)
shape, random pixels drawn once from a fixed seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge.errors import EdgeError
from edge.policy import inference
from edge.session import INPUT_NAME, OUTPUT_NAME, PolicySession, open_session

if TYPE_CHECKING:
    import torch

_OBS_SEED = 0
"""Seed of the fixed standard-normal observation (and random frames) every timed call sees."""

ImageShapes = Mapping[str, tuple[int, int, int]]
"""Image input name -> one frame's shape (height, width, 3), uint8 RGB HWC."""


@dataclass(frozen=True)
class LatencyReport:
    """Latency percentiles of one inference call at batch 1, in microseconds."""

    p50_us: float
    """Median call time, microseconds."""
    p99_us: float
    """99th-percentile call time, microseconds."""
    mean_us: float
    """Mean call time, microseconds."""
    iters: int
    """Number of timed calls."""
    provider: str
    """What ran the calls: an ONNX Runtime execution provider or ``torch-eager:<device>``."""
    images: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Each image input timed with its call, name -> one frame's (height, width, 3) uint8;
    empty for a state policy."""

    def inputs(self) -> str:
        """The timed inputs in words, e.g. ``obs + front_image 64x64x3 uint8``."""
        return "obs" + "".join(f" + {name} {'x'.join(map(str, shape))} uint8"
                               for name, shape in self.images.items())


def onnx_latency(
    onnx_path: Path, obs_dim: int, *, iters: int = 2000, warmup: int = 200, threads: int = 1,
    images: ImageShapes | None = None,
) -> LatencyReport:
    """Time ``session.run`` on ONNX Runtime CPU with ``threads`` intra-op threads.

    Each of ``iters`` calls on one observation (Shape: (1, obs_dim), float32) and, for a
    policy that sees, one random frame of each image input at the graph's shape (Shape:
    (1, H, W, 3), uint8) is timed with ``time.perf_counter_ns`` after ``warmup`` untimed
    calls. ``images``, when given (e.g. the bundle manifest's ``io.images``), must be the
    graph's image inputs and shapes.
    """
    _check_counts(iters, warmup)
    policy = open_session(onnx_path, threads=threads)
    if policy.obs_dim != obs_dim:
        raise EdgeError(f"{onnx_path}: model takes obs_dim {policy.obs_dim} (value: {obs_dim})")
    _check_images(onnx_path, policy, images)
    feed = bench_inputs(obs_dim, policy.images)
    session = policy.session

    def call() -> None:
        session.run([OUTPUT_NAME], feed)

    return _report(_time(call, iters, warmup), policy.provider, policy.images)


def diffusion_latency(
    onnx_path: Path, obs_dim: int, *, steps: int | None = None, iters: int = 50,
    warmup: int = 3, images: ImageShapes | None = None,
) -> LatencyReport:
    """Time one query of a diffusion policy (:meth:`~edge.session.PolicySession.sampler`,
    ``steps`` denoising steps, default its own) on ONNX Runtime CPU, one thread, as the runtime
    makes it: the history, a noise block drawn, the schedule, the graph. Each of ``iters``
    queries sees the fixed observation and frames of :func:`bench_inputs`."""
    _check_counts(iters, warmup)
    policy = open_session(onnx_path, threads=1)
    if policy.obs_dim != obs_dim:
        raise EdgeError(f"{onnx_path}: model takes obs_dim {policy.obs_dim} (value: {obs_dim})")
    _check_images(onnx_path, policy, images)
    sampler = policy.sampler(steps)
    feed = bench_inputs(obs_dim, policy.images)

    def call() -> None:
        sampler(feed)

    return _report(_time(call, iters, warmup), policy.provider, policy.images)


def bench_inputs(obs_dim: int, images: ImageShapes | None = None) -> dict[str, np.ndarray]:
    """One timed call's inputs by name: a fixed standard-normal observation (Shape:
    (1, obs_dim), float32) and a fixed random frame of each image input (Shape: (1, H, W, 3),
    uint8), all drawn from :data:`_OBS_SEED`."""
    feed = {INPUT_NAME: _observation(obs_dim)}
    rng = np.random.default_rng(_OBS_SEED + 1)
    for name, shape in (images or {}).items():
        feed[name] = rng.integers(0, 256, (1, *shape), dtype=np.uint8)
    return feed


def _check_images(onnx_path: Path, policy: PolicySession, images: ImageShapes | None) -> None:
    """Refuse expected image inputs that are not the graph's, by name and shape."""
    if images is None:
        return
    want = {name: tuple(shape) for name, shape in images.items()}
    if want != dict(policy.images):
        raise EdgeError(f"{onnx_path}: model takes images {dict(policy.images)} (value: "
                        f"{want})")


def torch_latency(
    module: torch.nn.Module,
    obs_dim: int,
    *,
    iters: int = 2000,
    warmup: int = 200,
    threads: int = 1,
    images: ImageShapes | None = None,
) -> LatencyReport:
    """Time eager ``module(obs)`` in eval mode without autograd, on the module's device.

    torch's intra-op thread count is set to ``threads`` for the measurement and restored
    afterwards. Each of ``iters`` calls on one observation (Shape: (1, obs_dim), float32)
    is timed with ``time.perf_counter_ns`` after ``warmup`` untimed calls; on CUDA each call
    includes a device synchronisation. A policy that sees is called ``module(obs, *frames)``
    with one random frame of each of ``images`` in order (Shape: (1, H, W, 3), uint8), the
    frames :func:`onnx_latency` feeds.
    """
    import torch

    _check_counts(iters, warmup)
    if threads < 1:
        raise EdgeError(f"torch latency: threads must be at least 1 (value: {threads})")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with inference(module) as device:
            args = [torch.from_numpy(v).to(device) for v in bench_inputs(obs_dim,
                                                                          images).values()]
            synchronize = torch.cuda.synchronize if device.type == "cuda" else None

            def call() -> None:
                module(*args)
                if synchronize is not None:
                    synchronize()

            samples = _time(call, iters, warmup)
    finally:
        torch.set_num_threads(previous)
    return _report(samples, f"torch-eager:{device.type}", images or {})


def _check_counts(iters: int, warmup: int) -> None:
    """Reject a timing run with no timed calls or a negative warmup."""
    if iters < 1 or warmup < 0:
        raise EdgeError(f"latency needs iters >= 1 and warmup >= 0 (value: {iters}, {warmup})")


def _observation(obs_dim: int) -> np.ndarray:
    """A fixed standard-normal observation. Shape: (1, obs_dim), float32."""
    if obs_dim < 1:
        raise EdgeError(f"latency: obs_dim must be at least 1 (value: {obs_dim})")
    rng = np.random.default_rng(_OBS_SEED)
    return rng.standard_normal((1, obs_dim)).astype(np.float32)


def _time(call: Callable[[], None], iters: int, warmup: int) -> np.ndarray:
    """Nanoseconds taken by each of ``iters`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    samples = np.empty(iters, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(iters):
        start = clock()
        call()
        samples[i] = clock() - start
    return samples


def _report(samples_ns: np.ndarray, provider: str, images: ImageShapes | None = None
            ) -> LatencyReport:
    """Summarise per-call nanoseconds as microsecond percentiles."""
    us = samples_ns.astype(np.float64) / 1e3
    p50, p99 = np.percentile(us, [50, 99])
    return LatencyReport(
        p50_us=float(p50),
        p99_us=float(p99),
        mean_us=float(us.mean()),
        iters=len(us),
        provider=provider,
        images=dict(images or {}),
    )
