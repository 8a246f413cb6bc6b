"""The rollout engine: one episode in every world of a batched environment, the policy in the
loop, filmed and recorded as validation asks; and how validation runs a policy's chunks."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from stages.evaluation.episodes import episode_table
from stages.evaluation.report_page import SUCCESS_MISS
from stages.evaluation.video import tile
from stages.policies.local import ChunkRunner, PolicyFn, run_chunks
from stages.sections.models import ValidateConfig
from stages.sim.env.batched import BatchedEnv
from stages.sim.env.bodies import BodyLayout, RecordsBodies
from stages.sim.env.capabilities import Falls, StatesMiss, capabilities_of
from stages.sim.env.observation import observe, sees
from stages.sim.env.overlap import GroupedEnv

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VideoSpec:
    """What to film during a rollout: the first ``episodes`` worlds, every ``every`` steps."""

    episodes: int
    width: int
    height: int
    every: int
    camera: str


@dataclass(frozen=True)
class Rollout:
    """Outcome of one episode per world. Shapes: (N,); frames: (H, K * W, 3) uint8 each.

    ``poses``: with a video, the filmed worlds' body poses at every step, where the
    environment can read them (:class:`~stages.sim.env.bodies.RecordsBodies`), for ``layout``'s
    bodies. Shape: (steps + 1, K, bodies, 7).
    """

    success: np.ndarray
    returns: np.ndarray
    final_reward: np.ndarray
    frames: list[np.ndarray]
    poses: np.ndarray | None = None
    layout: BodyLayout | None = None
    episodes: dict[str, np.ndarray] | None = None
    """One column per field of every episode (:func:`stages.evaluation.episodes.episode_table`)."""
    units: dict[str, str] | None = None
    """The unit of every column of ``episodes``."""
    seen: dict[str, np.ndarray] | None = None
    """For a policy that reads images: what it was given of its first worlds, every few
    steps (:class:`SeenFrames`), by image name (``front_image``). Shape of each:
    (frames, worlds, H, W, 3), uint8."""
    queries: int | None = None
    """For a policy that emits chunks of actions: how many times it was asked for chunks
    (:class:`~stages.policies.local.ChunkRunner`); None for a policy asked once a step."""
    query_latency_ms: dict[str, float] | None = None
    """For a policy that emits chunks: the latency of one query (all worlds' chunks), ms:
    ``p50``, ``p99``, ``max``."""


class TakesInstructions(Protocol):
    """A policy that reads each episode's instruction (a remote policy sends it as OpenPI's
    ``prompt``): told before every episode, as every world's episode starts."""

    def instruct(self, instructions: Sequence[str] | None) -> None:
        """The instruction of every world's coming episode (one text a world), or None:
        the scene gives none."""
        ...


def takes_instructions(act: object) -> bool:
    """Whether ``act`` (or the policy a wrapper of it forwards to) :class:`TakesInstructions`."""
    return callable(getattr(act, "instruct", None))


SEEN_FRAMES = 8
"""Most frames of a policy's camera images kept per episode when no video sets the pace."""


SEEN_WORLDS = 2
"""Worlds whose camera images are kept when no video names them."""


class SeenFrames:
    """A policy that reads images, keeping what it is given of the first ``worlds`` worlds at
    every ``every``-th call (from the first): a copy of the argument it already receives, so
    no camera renders twice. Everything else (``inputs``, ``failures``, ``reset``) is the
    policy's own."""

    def __init__(self, act: PolicyFn, every: int, worlds: int) -> None:
        self.act = act
        self.every = max(1, every)
        self.worlds = max(1, worlds)
        self.calls = 0
        self.kept: dict[str, list[np.ndarray]] = {}

    def __call__(self, observation: Any) -> np.ndarray:
        """``act(observation)``, its RGB images kept on the calls that are due."""
        if self.calls % self.every == 0 and isinstance(observation, Mapping):
            for name, value in observation.items():
                image = np.asarray(value)
                if image.dtype == np.uint8 and image.ndim == 4 and image.shape[-1] == 3:
                    self.kept.setdefault(name, []).append(image[:self.worlds].copy())
        self.calls += 1
        return self.act(observation)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.act, name)

    def frames(self) -> dict[str, np.ndarray] | None:
        """What was kept, by image name: (frames, worlds, H, W, 3) uint8; None if nothing."""
        return {k: np.stack(v) for k, v in self.kept.items()} or None


def rollout(env: BatchedEnv, act: PolicyFn, video: VideoSpec | None = None,
            instructions: Sequence[str] | None = None) -> Rollout:
    """Run one episode in every world, the policy called once per step for all worlds.

    With ``video``, the first worlds are rendered side by side every ``video.every`` steps; a
    renderer that fails (no offscreen OpenGL) is logged once and the rollout goes on unfilmed.
    Their body poses are recorded at every step, rendered or not. A policy that reads images
    has what it was given of the same worlds kept at the same steps (without a video: of the
    first :data:`SEEN_WORLDS`, :data:`SEEN_FRAMES` times an episode), in ``Rollout.seen``.
    An environment that states the miss below which an episode succeeds (a ``success_miss()``
    method, in the unit of its ``miss``) has it in every row of the episode table
    (:data:`stages.evaluation.report_page.SUCCESS_MISS`), which the report draws the misses against.
    A policy that emits chunks of actions runs as its :class:`~stages.policies.local.ChunkRunner`
    says (given one as ``act``; else all of each chunk): it is asked only when a chunk is due,
    its chunks are forgotten as every world's episode starts, and its queries are counted in
    ``Rollout.queries``. A :class:`~stages.sim.env.overlap.GroupedEnv` runs its overlapped
    episode where :func:`_overlapped` allows it. ``instructions`` (one text a world, the
    scene's :func:`~stages.sim.scenes.scene.episode_instructions`) go to a policy that
    :class:`TakesInstructions` before the episode and into the episode table's
    :data:`~stages.evaluation.episodes.INSTRUCTION` column.

    Steps: 1. the policy as it runs here (chunks; what a policy that sees is shown, kept);
    2. filming and body poses set up; 3. the last episode's policy state forgotten, the
    instructions given; 4. the
    episode, overlapped by groups or stepped; 5. the outcome: success, falls, the policy's
    failed worlds, the episode table; 6. a chunk policy's queries and their latency.
    """
    # -- 1. the policy as it runs here
    act = run_chunks(act, None)
    runner = act if isinstance(act, ChunkRunner) else None
    asked = runner.queries if runner is not None else 0
    watched = None
    if sees(act):
        every = video.every if video is not None else -(-env.episode_steps // SEEN_FRAMES)
        watched = act = SeenFrames(act, every, video.episodes if video else SEEN_WORLDS)
    # -- 2. filming and body poses
    film = _Film(env, video)
    # -- 3. the last episode's policy state forgotten
    reset = getattr(act, "reset", None)
    if callable(reset):  # chunks and a remote policy's failed calls are the last episode's
        reset()
    start = getattr(act, "start_episode", None)
    if callable(start):  # Python controllers, made afresh per world for this scene
        start(env)
    _instruct(act, instructions, env.num_worlds)
    # -- 4. the episode
    if isinstance(env, GroupedEnv) and _overlapped(env, act, runner, len(film.filmed), watched):
        def watch(k: int) -> None:
            film.record()
            if video is not None and k % video.every == 0:
                film.capture()

        returns, reward = env.episode(act, watch, policy_of=_group_policy(act, watched))
    else:
        returns, reward = _stepped(env, act, video, film.capture, film.record)
    # -- 5. the outcome
    success = env.success()
    declared = capabilities_of(env)
    fallen = cast(Falls, env).fallen() if declared.falls else None
    reasons: dict[int, str] = dict(getattr(act, "failures", None) or {})
    if reasons:  # a policy that could not answer for these worlds failed their episodes
        success = success.copy()
        success[list(reasons)] = False
    columns, units = episode_table(env, success, returns, fallen, reasons, instructions)
    if declared.success_miss and "miss" in columns:  # the threshold the misses are drawn at
        stated = cast(StatesMiss, env).success_miss()
        columns[SUCCESS_MISS] = np.full(len(success), float(stated))
        units[SUCCESS_MISS] = units["miss"]
    # -- 6. a chunk policy's queries
    queries, latency = None, None
    if runner is not None:
        queries = runner.queries - asked
        latency = _percentiles_ms(runner.query_ns[asked:])
    return Rollout(success, returns, reward, film.frames,
                   np.stack(film.poses) if film.poses else None,
                   film.layout if film.poses else None,
                   columns, units, watched.frames() if watched is not None else None,
                   queries, latency)


def _instruct(act: PolicyFn, instructions: Sequence[str] | None, worlds: int) -> None:
    """Give a policy that :class:`TakesInstructions` the ``instructions`` of its ``worlds``
    coming episodes; None too, so the last scene's are not taken for this one's."""
    if instructions is not None and len(instructions) != worlds:
        raise ValueError(f"{len(instructions)} instructions for {worlds} worlds")
    if takes_instructions(act):
        cast(TakesInstructions, act).instruct(instructions)


class _Film:
    """What :func:`rollout` films of ``env``: with ``video``, frames of the first worlds side
    by side (a renderer that fails, with no offscreen OpenGL, is logged once and filming
    stops), and their body poses where the environment records them."""

    def __init__(self, env: BatchedEnv, video: VideoSpec | None) -> None:
        self.env = env
        self.video = video
        self.frames: list[np.ndarray] = []
        self.poses: list[np.ndarray] = []
        self.layout: BodyLayout | None = None
        if video is not None and capabilities_of(env).body_layout:
            self.layout = cast(RecordsBodies, env).body_layout()
        self.filmed = list(range(min(video.episodes, env.num_worlds))) if video is not None else []

    def capture(self) -> None:
        """One frame of the filmed worlds, while the renderer works. Shape: (H, K * W, 3)."""
        film = self.video
        if film is None:
            return
        try:
            worlds = range(min(film.episodes, self.env.num_worlds))
            self.frames.append(tile(self.env.render(worlds, film.width, film.height,
                                                    film.camera)))
        except Exception as exc:
            log.warning("rollout video disabled: %s", exc)
            self.video = None

    def record(self) -> None:
        """The filmed worlds' body poses now. Shape: (K, bodies, 7)."""
        if self.layout is not None and self.filmed:  # a layout: the environment records bodies
            self.poses.append(cast(RecordsBodies, self.env).body_poses(self.filmed))


def _stepped(env: BatchedEnv, act: PolicyFn, video: VideoSpec | None,
             capture: Callable[[], None], record: Callable[[], None]
             ) -> tuple[np.ndarray, np.ndarray]:
    """One episode of :func:`rollout`, the policy called once a step for every world, with
    ``capture`` (a frame, when ``video`` says) and ``record`` (body poses) after the reset and
    every step. Returns every world's return and last reward. Shapes: (N,), (N,)."""
    obs = env.reset()
    capture()
    record()
    returns = np.zeros(env.num_worlds, np.float64)
    reward = np.zeros(env.num_worlds, np.float32)
    for t in range(env.episode_steps):
        obs, reward, _ = env.step(act(observe(env, obs, act)))
        returns += reward
        record()
        if video is not None and (t + 1) % video.every == 0:
            capture()
    return returns, reward


def _overlapped(env: GroupedEnv, act: PolicyFn, runner: ChunkRunner | None, filmed: int,
                watched: SeenFrames | None) -> bool:
    """Whether :func:`rollout` runs ``env``'s overlapped episode
    (:meth:`~stages.sim.env.overlap.GroupedEnv.episode`: the policy called once per group and
    step, each group rendering its own cameras, beside the other groups' rendering and
    physics): a policy that keeps nothing per world (no chunks, no per-world failures), and
    the ``filmed`` worlds and those whose frames ``watched`` keeps all in group 0."""
    seen = watched.worlds if watched is not None else 0
    return runner is None and _per_group(act) and max(filmed, seen) <= env.first_group_worlds()


def _per_group(act: PolicyFn) -> bool:
    """Whether ``act`` may be called for one group of worlds at a time
    (:meth:`~stages.sim.env.overlap.GroupedEnv.episode`): a function of what it reads of each
    world now (the state vector, the cameras) that keeps nothing per world (no chunks, no
    per-world failures, no reset)."""
    return not (isinstance(act, ChunkRunner) or hasattr(act, "failures")
                or callable(getattr(act, "reset", None)) or takes_instructions(act))


def _group_policy(act: PolicyFn, watched: SeenFrames | None
                  ) -> Callable[[int, BatchedEnv], Callable[[np.ndarray], np.ndarray]]:
    """What each group of an overlapped episode steps with: ``act`` given what it reads of
    the group's worlds, its cameras rendered by the group's environment on the group's
    thread. Group 0 (the first worlds) calls through ``watched``, which keeps what the
    first worlds were shown; the others call the policy itself."""

    def policy_of(group: int, env: BatchedEnv) -> Callable[[np.ndarray], np.ndarray]:
        policy = watched.act if group > 0 and watched is not None else act
        if not sees(policy):
            return policy
        return lambda obs: policy(observe(env, obs, policy))

    return policy_of


def _percentiles_ms(nanoseconds: list[int]) -> dict[str, float]:
    """``p50``, ``p99`` and ``max`` of call times given in ns, in ms; empty for none."""
    if not nanoseconds:
        return {}
    p50, p99, top = np.percentile(np.asarray(nanoseconds, np.float64) / 1e6, [50, 99, 100])
    return {"p50": float(p50), "p99": float(p99), "max": float(top)}


def chunk_runner(act: PolicyFn, cfg: ValidateConfig | None, field: str = "validate.chunk",
                 where: str = "policy") -> PolicyFn:
    """``act`` as validation runs it: a policy that emits chunks of actions as ``cfg.chunk``
    says (unset: all of each chunk), in a :class:`~stages.policies.local.ChunkRunner`; any other
    policy as it is. A chunk setting for a policy of one action a step is a one-line
    :class:`~physai_core.errors.ConfigError` naming ``where`` (the config file) and ``field``."""
    how = cfg.chunk.how() if cfg is not None and cfg.chunk is not None else None
    return run_chunks(act, how, field, where)


def chunk_spec(act: PolicyFn, cfg: ValidateConfig | None) -> dict[str, Any] | None:
    """How validation runs ``act``'s chunks, as a bundle manifest's ``io.chunk`` records it
    (:meth:`edge.runtime.ActionChunks.spec`); None for a policy of one action a step."""
    runner = chunk_runner(act, cfg)
    return dict(runner.spec) if isinstance(runner, ChunkRunner) else None
