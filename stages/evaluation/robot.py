"""A simulated robot behind the edge runtime's robot interface, and driving a bundle with it.

:func:`drive_bundle` is the bundle's last check before the robot: the on-robot runtime
(:mod:`edge.runtime`) loads and verifies the bundle tar, then runs its fixed-rate control loop
against a MuJoCo robot of the bundle's task in a scene, episode after episode. Success is the
task's own predicate, so the rate is comparable with the validation stage's on that scene.
The simulator advances one control period per loop step however fast the loop runs, so the
loop may run faster than the task's control rate; deadline misses are still counted. A bundle
whose policy sees gets, each step, the frames of the cameras it reads, rendered by the task's
environment at the current state (:meth:`SimRobot.frames`), as a robot's cameras would give.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stages.evaluation.stats import wilson_interval
from stages.sim.env.batched import BatchedEnv
from stages.sim.env.observation import camera_images
from stages.sim.scenes.scene import Scene
from stages.sim.tasks.catalog import get_task


class SimRobot:
    """One robot: world 0 of a one-world environment, reset after every episode.

    ``read`` returns the current observation; ``frames`` renders its cameras now; ``apply``
    steps the simulation one control period. At the end of each episode its success is
    recorded and a new episode, with fresh randomization, begins.
    """

    def __init__(self, env: BatchedEnv) -> None:
        if env.num_worlds != 1:
            raise ValueError(f"a SimRobot drives one world (value: {env.num_worlds})")
        self.env = env
        self.successes: list[bool] = []
        self._obs = env.reset()[0]
        self._t = 0

    def read(self) -> np.ndarray:
        """The current observation. Shape: (obs_dim,), float32."""
        return self._obs.copy()

    def episode_started(self) -> bool:
        """Whether the current observation is the first of an episode (the control loop's
        ``new_episode``: a policy's chunks start afresh with each episode, as in validation)."""
        return self._t == 0

    def frames(self) -> dict[str, np.ndarray]:
        """Every camera image of the task at the current state, by tensor name (the control
        loop's camera callable). Shape: ``<camera>_image`` (height, width, 3) uint8 each."""
        return {name: images[0] for name, images in camera_images(self.env).items()}

    def apply(self, action: np.ndarray) -> None:
        """Step one control period with ``action``. Shape: (act_dim,)."""
        obs, _, _ = self.env.step(np.asarray(action, np.float32)[None])
        self._t += 1
        if self._t == self.env.episode_steps:
            self.successes.append(bool(self.env.success()[0]))
            obs = self.env.reset()
            self._t = 0
        self._obs = obs[0]


@dataclass(frozen=True)
class DriveResult:
    """Episodes the runtime drove and how its control loop kept time."""

    scene: str
    provider: str
    episodes: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    rate_hz: float
    steps: int
    deadline_misses: int
    safe_holds: int
    latency_p50_us: float
    latency_p99_us: float
    malformed_inputs: int = 0
    """Steps whose observation or camera frames the runtime refused (see
    :class:`edge.runtime.LoopStats`)."""
    queries: int = 0
    """Calls of the policy; fewer than the steps for a policy that emits chunks and runs
    several actions of each. The latencies are of these calls."""
    chunk: dict[str, object] | None = None
    """The bundle's ``io.chunk`` the loop ran (its chunk size and how), None for a policy of
    one action a query."""


def drive_bundle(
    bundle: Path, scene: Scene, episodes: int, *, rate_hz: float | None = None, seed: int = 0,
    engine: Path | None = None, trust_key: Path | None = None, allow_unsigned: bool = False,
) -> DriveResult:
    """Run ``episodes`` episodes of ``scene`` with the bundle through the edge runtime.

    ``rate_hz`` is the loop rate (default: the bundle's control rate). The bundle is unpacked
    and verified by the runtime into a temporary folder that is removed afterwards. With
    ``engine`` (a TensorRT engine built from this bundle on the target) the loop runs the
    engine instead of ONNX Runtime. The runtime runs the bundle only when ``trust_key`` (a
    PEM public key) signed it, or with ``allow_unsigned`` (see :func:`edge.runtime.load_bundle`).
    A policy that sees reads the frames the task's cameras render each step
    (:meth:`SimRobot.frames`); a bundle reading an image the task does not render, or at
    another size, is refused in one line. A policy that emits chunks runs them as the
    manifest's ``io.chunk`` says, afresh each episode, as validation ran them.
    """
    from edge.runtime import (
        ControlLoop,
        LoadedPolicy,
        RuntimeRefusal,
        TensorRTPolicy,
        load_bundle,
    )

    if episodes < 1:
        raise ValueError(f"episodes must be at least 1 (value: {episodes})")
    with tempfile.TemporaryDirectory(prefix="physai-drive-") as scratch:
        policy = load_bundle(Path(bundle), Path(scratch) / "policy",
                             providers=["CPUExecutionProvider"], trust_key=trust_key,
                             allow_unsigned=allow_unsigned)
        task = policy.manifest.get("task")
        if task != scene.config.task:
            raise RuntimeRefusal(f"{bundle}: bundle task {task!r} differs from scene "
                                 f"{scene.config.name!r}'s task {scene.config.task!r}")
        runner: LoadedPolicy | TensorRTPolicy = (
            policy if engine is None else TensorRTPolicy(policy, engine))
        env = get_task(task).make_env(scene, 1, seed, num_threads=1)
        try:
            robot = SimRobot(env)
            rate = rate_hz or policy.control_hz
            cameras = _cameras_for(bundle, policy.images, robot)
            stats = ControlLoop(runner, robot, rate, cameras=cameras,
                                new_episode=robot.episode_started).run(
                episodes * env.episode_steps)
        finally:
            if isinstance(runner, TensorRTPolicy):
                runner.close()
            env.close()
    k = sum(robot.successes)
    low, high = wilson_interval(k, episodes)
    return DriveResult(
        scene=scene.config.name, provider=runner.provider, episodes=episodes, successes=k,
        success_rate=k / episodes, ci_low=low, ci_high=high, rate_hz=rate,
        steps=stats.steps, deadline_misses=stats.deadline_misses, safe_holds=stats.safe_holds,
        latency_p50_us=stats.latency_p50_us, latency_p99_us=stats.latency_p99_us,
        malformed_inputs=stats.malformed_inputs, queries=stats.queries, chunk=policy.chunk,
    )


def _cameras_for(bundle: Path, images: dict[str, tuple[int, int, int]], robot: SimRobot
                 ) -> Callable[[], dict[str, np.ndarray]] | None:
    """The camera callable of a policy reading ``images`` (name -> (H, W, 3)): the robot's
    :meth:`SimRobot.frames`, checked once against what the task renders; None for a state
    policy."""
    from edge.runtime import RuntimeRefusal

    if not images:
        return None
    rendered = {name: frame.shape for name, frame in robot.frames().items()}
    for name, shape in images.items():
        if rendered.get(name) != shape:
            given = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in rendered.items())
            raise RuntimeRefusal(f"{bundle}: the policy reads {name} "
                                 f"{'x'.join(map(str, shape))}, the task's cameras render "
                                 f"{given or 'no image'}")
    return robot.frames
