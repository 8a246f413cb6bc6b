"""The validate stage: roll the policy out over a frozen scene suite and apply the gates."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.artifacts.records import (
    CriticVerdict,
    EpisodeRecords,
    GateResult,
    Policy,
    RolloutUsd,
    RolloutVideo,
    SceneResult,
    SequentialVerdict,
    SimReport,
    SimToSim,
    SweepCurve,
)
from stages.core.crash import crash_point
from stages.evaluation.episodes import episode_table, write_parquet
from stages.evaluation.report_page import SUCCESS_MISS
from stages.evaluation.sensitivity import METHOD as SENSITIVITY_METHOD
from stages.evaluation.sensitivity import factor_effects
from stages.evaluation.stats import wilson_interval
from stages.evaluation.usd import write_rollout_usd
from stages.evaluation.video import tile, write_gif
from stages.orchestration.context import Progress, StageContext, current_progress
from stages.orchestration.envcall import placed, validate_scene_in
from stages.pipeline.config import CriticConfig, ValidateConfig
from stages.policies.local import ChunkRunner, PolicyFn, load_actor, run_chunks
from stages.sections.models import ChunkConfig
from stages.sim.env.batched import BatchedEnv
from stages.sim.env.bodies import BodyLayout, RecordsBodies
from stages.sim.env.observation import observe, sees
from stages.sim.env.overlap import GroupedEnv, grouped_env
from stages.sim.tasks.catalog import TaskSpec, get_task
from stages.tracking.lineage import LineageRecorder, StageRun

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from stages.evaluation.sequential import Design
    from stages.sim.suites.suite import Suite

log = logging.getLogger(__name__)

STAGE_VERSION = "4"

REPORT_HTML = "report.html"
"""The evaluation report's file name in the validation run's MLflow artifacts."""


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


def rollout(env: BatchedEnv, act: PolicyFn, video: VideoSpec | None = None) -> Rollout:
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
    episode where :func:`_overlapped` allows it.
    """
    act = run_chunks(act, None)
    runner = act if isinstance(act, ChunkRunner) else None
    asked = runner.queries if runner is not None else 0
    frames: list[np.ndarray] = []
    watched = None
    if sees(act):
        every = video.every if video is not None else -(-env.episode_steps // SEEN_FRAMES)
        watched = act = SeenFrames(act, every, video.episodes if video else SEEN_WORLDS)
    film = video
    layout = None
    if video is not None and isinstance(env, RecordsBodies):
        layout = env.body_layout()
    filmed = list(range(min(video.episodes, env.num_worlds))) if video is not None else []
    poses: list[np.ndarray] = []

    def capture() -> None:
        nonlocal film
        if film is None:
            return
        try:
            worlds = range(min(film.episodes, env.num_worlds))
            frames.append(tile(env.render(worlds, film.width, film.height, film.camera)))
        except Exception as exc:
            log.warning("rollout video disabled: %s", exc)
            film = None

    def record() -> None:
        if layout is not None and filmed and isinstance(env, RecordsBodies):
            poses.append(env.body_poses(filmed))

    reset = getattr(act, "reset", None)
    if callable(reset):  # chunks and a remote policy's failed calls are the last episode's
        reset()
    if isinstance(env, GroupedEnv) and _overlapped(env, act, runner, len(filmed), watched):
        def watch(k: int) -> None:
            record()
            if video is not None and k % video.every == 0:
                capture()

        returns, reward = env.episode(act, watch, policy_of=_group_policy(act, watched))
    else:
        returns, reward = _stepped(env, act, video, capture, record)
    success = env.success()
    read_fallen = getattr(env, "fallen", None)
    fallen = read_fallen() if callable(read_fallen) else None
    reasons: dict[int, str] = dict(getattr(act, "failures", None) or {})
    if reasons:  # a policy that could not answer for these worlds failed their episodes
        success = success.copy()
        success[list(reasons)] = False
    columns, units = episode_table(env, success, returns, fallen, reasons)
    stated = getattr(env, "success_miss", None)
    if callable(stated) and "miss" in columns:  # the threshold the report draws the misses at
        columns[SUCCESS_MISS] = np.full(len(success), float(stated()))
        units[SUCCESS_MISS] = units["miss"]
    queries, latency = None, None
    if runner is not None:
        queries = runner.queries - asked
        latency = _percentiles_ms(runner.query_ns[asked:])
    return Rollout(success, returns, reward, frames,
                   np.stack(poses) if poses else None, layout if poses else None,
                   columns, units, watched.frames() if watched is not None else None,
                   queries, latency)


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
                or callable(getattr(act, "reset", None)))


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


def evaluate_scene(
    env: BatchedEnv, act: PolicyFn, scene: str, episodes: int, video: VideoSpec | None = None
) -> tuple[SceneResult, Rollout]:
    """Success rate with a 95% Wilson interval and mean return for one scene, and the rollout
    (its frames and poses)."""
    out = rollout(env, act, video)
    return _scene_result(scene, out, episodes), out


def _scene_result(scene: str, out: Rollout, episodes: int) -> SceneResult:
    """A scene's statistics from its ``episodes`` episodes' outcomes."""
    k = int(out.success.sum())
    low, high = wilson_interval(k, episodes)
    factors = factor_effects(out.episodes, out.units or {}) if out.episodes else ()
    modes: dict[str, int] = {}
    for why in (out.episodes or {}).get("failure", ()):
        if why:
            modes[str(why)] = modes.get(str(why), 0) + 1
    return SceneResult(
        scene=scene,
        episodes=episodes,
        successes=k,
        success_rate=k / episodes,
        ci_low=low,
        ci_high=high,
        mean_return=float(out.returns.mean()),
        mean_final_reward=float(out.final_reward.mean()),
        factors=factors,
        failure_modes=modes,
        outcomes="".join("1" if x else "0" for x in out.success),
    )


def scene_threshold(cfg: ValidateConfig, scene: str) -> float:
    """The success rate scene ``scene``'s gate asks of its interval's lower bound."""
    return cfg.scene_min_success.get(scene, cfg.min_success)


def sequential_design(cfg: ValidateConfig | None, scene: str, episodes: int) -> Design | None:
    """The calibrated sequential gate of a scene (stages/evaluation/sequential.py), or None where
    the scene spends its full count: no ``validate.sequential``, a threshold of 0, which no policy
    can fail short of, or of 1, which no interval reaches."""
    if cfg is None or cfg.sequential is None:
        return None
    threshold = scene_threshold(cfg, scene)
    if not 0.0 < threshold < 1.0:
        return None
    seq = cfg.sequential
    from stages.evaluation.sequential import design

    plan = design(threshold, min(1.0, threshold + seq.indifference), seq.alpha, seq.beta,
                  episodes, min(seq.chunk, episodes))
    if plan.beta > seq.beta:
        _short_of_beta(scene, episodes, plan, seq.beta)
    return plan


def _short_of_beta(scene: str, episodes: int, plan: Design, beta: float) -> None:
    """Say that ``episodes`` are too few for a sequential gate to fail a policy at
    ``plan.p_hold`` at most ``beta`` of the time: a warning where the sequential gate fails it
    more often than the full-count gate of as many episodes would (the Wilson lower bound
    against the threshold, :func:`stages.evaluation.stats.wilson_gate_fail_chance`), else a note,
    since the count, not the early stop, is what falls short (the gate's detail records the rate
    either way)."""
    from stages.evaluation.stats import wilson_gate_fail_chance

    full = wilson_gate_fail_chance(plan.p_fail, plan.p_hold, episodes)
    worse = plan.beta > full
    (log.warning if worse else log.info)(
        "scene %s: %d episodes are too few for a sequential gate that fails a policy at %.3g "
        "at most %.3g of the time; it does %.3g of the time, %s the %.3g of the full-count "
        "gate of %d episodes (a policy at the threshold %.3g passes %.3g of the time)",
        scene, episodes, plan.p_hold, beta, plan.beta,
        "more often than" if worse else "no more often than", full, episodes, plan.p_fail,
        plan.alpha)


def sequential_threshold(cfg: ValidateConfig, suite: Suite, index: int) -> float | None:
    """The threshold of run ``index`` of ``suite`` (:meth:`Suite.run`) where it runs under a
    sequential gate, else None: scenes on the suite's own backend with a threshold between 0
    and 1, not their sweep points or their runs on a ``compare_backend``, which measure a rate
    rather than decide a gate."""
    if cfg.sequential is None or index >= len(suite.scenes) or \
            suite.sweep_point(index) is not None:
        return None
    threshold = scene_threshold(cfg, suite.scenes[index].scene.config.name)
    return threshold if 0.0 < threshold < 1.0 else None


def scene_sequential(cfg: ValidateConfig, suite: Suite, index: int) -> Design | None:
    """The calibrated sequential design of run ``index`` of ``suite``, or None: see
    :func:`sequential_threshold`."""
    if sequential_threshold(cfg, suite, index) is None:
        return None
    scene, episodes, _ = suite.scenes[index]
    return sequential_design(cfg, scene.config.name, episodes)


def _joined(parts: list[Rollout]) -> Rollout:
    """The rollouts of a scene's chunks as one, its filmed episodes the first chunk's."""
    first = parts[0]
    if len(parts) == 1:
        return first
    columns = None
    if first.episodes is not None:
        columns = {name: np.concatenate([p.episodes[name] for p in parts if p.episodes])
                   for name in first.episodes}
    queries = None if first.queries is None else sum(p.queries or 0 for p in parts)
    return Rollout(np.concatenate([p.success for p in parts]),
                   np.concatenate([p.returns for p in parts]),
                   np.concatenate([p.final_reward for p in parts]), first.frames, first.poses,
                   first.layout, columns, first.units, first.seen, queries,
                   first.query_latency_ms)


def evaluate_scene_sequential(
    make_env: Callable[[int, int], BatchedEnv], act: PolicyFn, scene: str, seed: int,
    design: Design, video: VideoSpec | None = None,
    advance: Callable[[int, float], None] | None = None,
) -> tuple[SceneResult, Rollout]:
    """:func:`evaluate_scene` a chunk of worlds at a time until ``design`` reaches a verdict;
    ``make_env(worlds, seed)`` builds a chunk, the first from ``seed`` (its worlds are the first
    of the scene's fixed run where the backend seeds world i from the i-th number of
    ``SeedSequence(seed)``), chunk ``i`` from ``SeedSequence([seed, i])``.
    The first chunk is filmed; ``advance(episodes, success_rate)`` follows every chunk."""
    from stages.evaluation.sequential import METHOD

    parts: list[Rollout] = []
    seen = successes = 0
    verdict = None
    for index, look in enumerate(design.looks):
        chunk_seed = seed if index == 0 else \
            int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
        env = make_env(look - seen, chunk_seed)
        parts.append(rollout(env, act, video if index == 0 else None))
        env.close()
        successes += int(parts[-1].success.sum())
        if advance is not None:
            advance(look - seen, successes / look)
        seen = look
        verdict = design.decide(successes, seen)
        if verdict is not None:
            break
    if verdict is None:  # the last look always decides
        raise RuntimeError(f"sequential design of {scene!r} ended without a verdict")
    out = _joined(parts)
    result = _scene_result(scene, out, seen)
    return result.model_copy(update={"sequential": SequentialVerdict(
        verdict=verdict, episodes=seen, max_episodes=design.max_episodes,
        chunk=design.looks[0], p_fail=design.p_fail, p_hold=design.p_hold,
        alpha=design.alpha, beta=design.beta, method=METHOD)}), out


def evaluate_suite(
    suite: Suite, act: PolicyFn, *, episodes: int | None = None, seed_offset: int = 0,
    progress: Progress | None = None, label: str = "validate", device: str = "auto",
    gates: ValidateConfig | None = None, rollouts: dict[str, Rollout] | None = None,
    chunk: ChunkConfig | None = None,
) -> tuple[SceneResult, ...]:
    """Every scene of ``suite`` with ``act``, one after the other, unfilmed: its episode count
    (or ``episodes``) from its seed (shifted by ``seed_offset``), as the validate stage runs it.
    With ``gates`` that ask for a sequential gate, each scene with a threshold above 0 stops
    once its verdict is clear (:func:`evaluate_scene_sequential`). With ``rollouts``, each
    scene's :class:`Rollout` (its episode table, what a policy that sees was shown) is put
    there by scene name. A policy that emits chunks of actions runs as ``chunk`` says, else
    as ``gates.chunk`` does (:func:`chunk_runner`; the nightly passes its pipeline's
    ``validate.chunk`` without the gates).
    """
    from stages.sim.backends.catalog import make_backend_env

    if chunk is not None:
        act = run_chunks(act, chunk.how())
    act = chunk_runner(act, gates)
    spec = get_task(suite.config.task)
    progress = progress or current_progress()
    backend = suite.config.backend
    results = []
    for scene, count, seed in suite.scenes:
        n = episodes or count
        design = sequential_design(gates, scene.config.name, n)
        with progress.bar(f"{label} {scene.config.name}", n) as bar:
            if design is not None:
                def chunk_env(worlds: int, chunk_seed: int, scene: Any = scene) -> BatchedEnv:
                    return make_backend_env(backend, spec, scene, worlds, chunk_seed,
                                            device=device)

                result, out = evaluate_scene_sequential(
                    chunk_env, act, scene.config.name, seed + seed_offset, design,
                    advance=lambda k, rate: bar.advance(k, success=f"{rate:.2f}"))
            else:
                env = make_backend_env(backend, spec, scene, n, seed + seed_offset,
                                       device=device)
                result, out = evaluate_scene(env, act, scene.config.name, n)
                bar.advance(n, success=f"{result.success_rate:.2f}")
                env.close()
        results.append(result)
        if rollouts is not None:
            rollouts[scene.config.name] = out
    return tuple(results)


def evaluate_sweeps(
    suite: Suite, act: PolicyFn, *, episodes: int | None = None,
    progress: Progress | None = None, device: str = "auto", gates: ValidateConfig | None = None,
) -> tuple[SweepCurve, ...]:
    """Every sweep point of ``suite`` with ``act``, unfilmed, as the validate stage runs it:
    each point its scene with the swept fields held at the point's values, with the scene's
    episode count (or ``episodes``) and seed; one curve per swept scene. A policy that emits
    chunks of actions runs as ``gates.chunk`` says (:func:`chunk_runner`)."""
    from stages.sim.backends.catalog import make_backend_env
    from stages.sim.scenes.scene import point_label, sweep_variant

    act = chunk_runner(act, gates)
    spec = get_task(suite.config.task)
    progress = progress or current_progress()
    points = []
    for index, point in suite.sweeps:
        entry = suite.scenes[index]
        n = episodes or entry.episodes
        scene = sweep_variant(entry.scene, point)
        env = make_backend_env(suite.config.backend, spec, scene, n, entry.seed, device=device)
        with progress.bar(f"validate {entry.scene.name} at {point_label(point)}", n) as bar:
            result, _ = evaluate_scene(env, act, entry.scene.name, n)
            bar.advance(n, success=f"{result.success_rate:.2f}")
        env.close()
        points.append(result.model_copy(update={"backend": suite.config.backend,
                                                "sweep": point}))
    return _sweep_curves(suite, tuple(points))


def gate_scenes(cfg: ValidateConfig, scenes: tuple[SceneResult, ...]) -> tuple[GateResult, ...]:
    """One gate per scene: the interval's lower bound must reach the scene's threshold, or,
    for a scene run sequentially, the sequential design's verdict
    (stages/evaluation/sequential.py)."""
    gates = []
    for s in scenes:
        threshold = scene_threshold(cfg, s.scene)
        detail = (f"{s.successes}/{s.episodes} = {s.success_rate:.3f} "
                  f"[{s.ci_low:.3f}, {s.ci_high:.3f}]")
        passed = s.ci_low >= threshold
        if s.sequential is not None:
            seq = s.sequential
            passed = seq.verdict == "pass"
            detail += (f"; sequential {seq.verdict} after {seq.episodes} of {seq.max_episodes} "
                       f"episodes (chance to pass at {seq.p_fail:g}: {seq.alpha:.3f}, to fail "
                       f"at {seq.p_hold:.3g}: {seq.beta:.3f})")
        gates.append(GateResult(name=f"success/{s.scene}", measured=s.ci_low,
                                threshold=threshold, passed=passed, detail=detail))
    return tuple(gates)


def _scene_index_environment(cfg: ValidateConfig, policy: Policy, index: int,
                     ctx: StageContext) -> str | None:
    """The stage environment scene ``index`` runs in (:func:`scene_environment`)."""
    backend, _ = ctx.pipeline.suite.run(index)
    return scene_environment(cfg, backend)


@placed(_scene_index_environment, validate_scene_in)
def validate_scene(
    cfg: ValidateConfig, policy: Policy, index: int, ctx: StageContext
) -> SceneResult:
    """Evaluate ``policy`` on scene ``index`` of the suite, with its episode count and seed.

    ``index`` counts the suite's :attr:`~stages.sim.scenes.scene.Suite.runs`: every scene on its
    backend, then (with ``compare_backend``) every scene on the second one. Scenes are
    independent, so the flow fans them out in parallel and caches each on its own. The first
    episodes are filmed and the GIF is published to the store. With ``validate.environment``,
    or on a backend that implies one (Isaac Lab), the scene runs in that stage environment's
    interpreter.
    """
    from stages.sim.backends.catalog import make_backend_env

    backend, (scene, episodes, seed) = ctx.pipeline.suite.run(index)
    spec = get_task(policy.task)
    act = chunk_runner(load_actor(ctx.store.open_payload(policy)), cfg,
                       where=str(ctx.pipeline.path))
    point = ctx.pipeline.suite.sweep_point(index)
    video = None
    if cfg.video_episodes and point is None:
        video = VideoSpec(cfg.video_episodes, *cfg.video_size, cfg.video_every, spec.camera)
    label = scene.config.name if index < len(ctx.pipeline.suite.scenes) else \
        f"{scene.config.name} on {backend}"
    if point is not None:
        from stages.sim.scenes.scene import point_label

        label = f"{scene.config.name} at {point_label(point)}"
    design = scene_sequential(cfg, ctx.pipeline.suite, index)
    with ctx.progress.bar(f"validate {label}", episodes) as bar:
        if design is not None:
            def chunk_env(worlds: int, chunk_seed: int) -> BatchedEnv:
                return tiled_as(cfg, make_backend_env(backend, spec, scene, worlds, chunk_seed,
                                                      device=cfg.device))

            result, out = evaluate_scene_sequential(
                chunk_env, act, scene.config.name, seed, design, video,
                advance=lambda n, rate: bar.advance(n, success=f"{rate:.2f}"))
        else:
            env = grouped_env(lambda n, s, threads: tiled_as(cfg, make_backend_env(
                backend, spec, scene, n, s, num_threads=threads, device=cfg.device)),
                episodes, seed, min(cfg.overlap_groups, episodes))
            try:
                result, out = evaluate_scene(env, act, scene.config.name, episodes, video)
            finally:
                env.close()
            bar.advance(episodes, success=f"{result.success_rate:.2f}")
    result = result.model_copy(update={"backend": backend, "sweep": point})
    if out.queries is not None:
        log.info("scene %s: %d queries of the policy's chunks (%s) for %d steps of %d worlds; "
                 "one query p50 %.3f ms, p99 %.3f ms", label, out.queries,
                 getattr(act, "spec", {}), scene.config.episode_steps, episodes,
                 (out.query_latency_ms or {}).get("p50", 0.0),
                 (out.query_latency_ms or {}).get("p99", 0.0))
    crash_point(f"validate.scene_evaluated.{scene.config.name}")
    name = f"{scene.config.name}-{backend}-{policy.digest[:12]}-{seed}"
    if point is not None:
        from stages.core.hashing import sha256_json

        name += "-sweep-" + sha256_json(point)[:12]
    filmed = 0 if video is None else \
        min(video.episodes, design.looks[0] if design is not None else episodes)
    return _publish_scene(cfg, policy, spec, scene.config.name, name, result, out, video,
                          filmed, ctx)


def tiled_as(cfg: ValidateConfig, env: BatchedEnv) -> BatchedEnv:
    """``env`` with its cameras rendering as ``validate.camera_tiles`` says (an environment
    that renders no tiles, or an unset field, is left as it is)."""
    if cfg.camera_tiles is not None and hasattr(env, "camera_tiles"):
        env.camera_tiles = cfg.camera_tiles
    return env


def _publish_scene(cfg: ValidateConfig, policy: Policy, spec: TaskSpec, scene: str, name: str,
                   result: SceneResult, out: Rollout, video: VideoSpec | None,
                   filmed: int, ctx: StageContext) -> SceneResult:
    """Publish a scene's episode table, GIF and USD rollout to the store (and ask the critic
    about the filmed episodes); returns ``result`` carrying their digests."""
    parents = (policy.digest,)
    if out.episodes is not None:
        path = ctx.scratch / f"{name}.parquet"
        write_parquet(path, out.episodes, out.units or {})
        table = ctx.publish(path, EpisodeRecords, "validate", STAGE_VERSION, parents, None,
                            scene=scene, episodes=result.episodes, columns=tuple(out.episodes))
        result = result.model_copy(update={"episodes_digest": table.digest})
    if video is None:
        return result
    if out.frames:
        path = ctx.scratch / f"{name}.gif"
        write_gif(beside_seen(out.frames, out.seen), path, fps=spec.control_hz / video.every)
        clip = ctx.publish(path, RolloutVideo, "validate", STAGE_VERSION, parents, None,
                           scene=scene, episodes=filmed)
        result = result.model_copy(update={"video_digest": clip.digest})
    if cfg.critic is not None:
        result = result.model_copy(update={"critic": _critique(cfg.critic, spec, scene,
                                                               filmed, out, video)})
    if out.poses is not None and out.layout is not None:
        path = ctx.scratch / f"{name}.usda"
        write_rollout_usd(path, out.layout, out.poses, fps=spec.control_hz)
        stage = ctx.publish(path, RolloutUsd, "validate", STAGE_VERSION, parents, None,
                            scene=scene, episodes=filmed, steps=len(out.poses))
        result = result.model_copy(update={"usd_digest": stage.digest})
    return result


def beside_seen(frames: list[np.ndarray], seen: Mapping[str, np.ndarray] | None
                ) -> list[np.ndarray]:
    """The rollout's frames, each with what the policy's cameras showed it at that step to its
    right (the same worlds side by side, one camera under the other, scaled by a whole
    factor to fit the frame's height); the frames alone when it was shown none. A frame after the
    policy's last call shows its last images.

    Shapes: ``frames`` (H, K * W, 3) uint8 each; ``seen`` (F, K, h, w, 3) uint8 by name.
    """
    if not seen or not frames:
        return frames
    height = frames[0].shape[0]
    out = []
    for i, frame in enumerate(frames):
        strips = [tile(images[min(i, len(images) - 1)]) for images in seen.values()]
        wide = max(strip.shape[1] for strip in strips)
        column = np.concatenate([np.pad(strip, ((0, 0), (0, wide - strip.shape[1]), (0, 0)))
                                 for strip in strips], axis=0)
        shrink = -(-column.shape[0] // height)
        column = column[::shrink, ::shrink]
        scale = max(1, height // column.shape[0])
        big = np.repeat(np.repeat(column, scale, 0), scale, 1)
        pad = np.zeros((height - big.shape[0], big.shape[1], 3), np.uint8)
        out.append(np.concatenate([frame, np.concatenate([big, pad], axis=0)], axis=1))
    return out


def scene_environment(cfg: ValidateConfig, backend: str) -> str | None:
    """The stage environment a scene on ``backend`` runs in: ``validate.environment``, else the
    one the backend implies, else None (this process)."""
    from stages.sim.backends.catalog import get_backend

    return cfg.environment or get_backend(backend).environment


def _critique(cfg: CriticConfig, spec: TaskSpec, scene: str, episodes: int, out: Rollout,
              video: VideoSpec) -> CriticVerdict:
    """The Cosmos critic's verdict on a scene's filmed episodes, or on what the policy saw of
    them (``validate.critic.camera``; stages/evaluation/critic.py)."""
    from stages.evaluation import critic
    frames, camera = critic.watched(cfg, scene, out.frames, out.seen)
    ep = critic.endpoint(cfg)
    clip = critic.encode_mp4(frames, fps=spec.control_hz / video.every)
    prompt = critic.PROMPT.format(episodes=episodes, task=spec.name, scene=scene,
                                  success=spec.success_tolerance)
    if camera is not None:
        prompt += critic.SEEN_NOTE.format(camera=camera)
    verdict = critic.judge(ep, scene, clip, prompt)
    log.info("Cosmos critic on %s: %s", scene, "pass" if verdict.passed else "FAIL")
    return verdict


def gate_critic(cfg: ValidateConfig, scenes: tuple[SceneResult, ...]) -> tuple[GateResult, ...]:
    """The critic's gate, when ``validate.critic.min_pass_rate`` asks for one: the share of
    judged scenes found plausible and done."""
    if cfg.critic is None or cfg.critic.min_pass_rate is None:
        return ()
    verdicts = [s.critic for s in scenes if s.critic is not None]
    passed = sum(v.passed for v in verdicts)
    rate = passed / len(verdicts) if verdicts else 0.0
    model = verdicts[0].model if verdicts else "no verdict"
    return (GateResult(name="critic/pass_rate", measured=rate,
                       threshold=cfg.critic.min_pass_rate,
                       passed=bool(verdicts) and rate >= cfg.critic.min_pass_rate,
                       detail=f"{passed}/{len(verdicts)} scenes plausible and done ({model})"),)


def assemble_report(
    cfg: ValidateConfig, policy: Policy, scenes: tuple[SceneResult, ...], ctx: StageContext
) -> SimReport:
    """Gate the per-scene results, log them with a plot to MLflow and publish the report."""
    from stages.sim.backends.catalog import backend_version

    suite = ctx.pipeline.suite
    backend = suite.config.backend
    version = backend_version(backend)
    n = len(suite.scenes)
    plain = n * len(suite.backends)
    scenes, second, swept = scenes[:n], scenes[n:plain], scenes[plain:]
    sim_to_sim = _sim_to_sim(cfg, suite.config.compare_backend, scenes, second)
    sweeps = _sweep_curves(suite, swept)
    gates = gate_scenes(cfg, scenes) + gate_critic(cfg, scenes) + gate_sim_to_sim(cfg, sim_to_sim)
    passed = all(g.passed for g in gates)
    with ctx.lineage.stage_run(ctx.experiment, "validate", ctx.pipeline_run_id, {}) as run:
        run.log_params({"suite": suite.config.name, "suite_digest": suite.digest,
                        "min_success": cfg.min_success, "backend": backend,
                        "backend_version": version})
        for r in scenes:
            run.log_metrics({f"{r.scene}/success_rate": r.success_rate,
                             f"{r.scene}/ci_low": r.ci_low, f"{r.scene}/ci_high": r.ci_high,
                             f"{r.scene}/mean_return": r.mean_return})
        body = {
            "suite": suite.config.name,
            "suite_digest": suite.digest,
            "backend": backend,
            "backend_version": version,
            "policy_digest": policy.digest,
            "scenes": [r.model_dump() for r in scenes],
            "gates": [g.model_dump() for g in gates],
            "passed": passed,
        }
        _log_extras(run, body, scenes, sweeps, sim_to_sim)
        chunk = _ran_chunks(cfg, policy, ctx)
        if chunk is not None:
            body["chunk"] = chunk
            run.log_params({"chunk": json.dumps(chunk, sort_keys=True)})
        run.log_dict(body, "sim_report.json")
        _log_videos(run, scenes, ctx)
        _log_episodes(run, scenes, ctx)
        plots = _log_plots(run, scenes, gates, sweeps, sim_to_sim)
        if sim_to_sim is not None:
            _log_videos(run, sim_to_sim.scenes, ctx, f"-{sim_to_sim.backend}")
        run.log_figure(plots["success"], "success_rates.png")
        path = ctx.scratch / f"report-{run.run_id}.json"
        path.write_text(json.dumps(body, indent=2, sort_keys=True))
        report = ctx.publish(
            path, SimReport, "validate", STAGE_VERSION, (policy.digest,), run.run_id,
            suite=suite.config.name,
            suite_digest=suite.digest,
            backend=backend,
            backend_version=version,
            scenes=scenes,
            gates=gates,
            passed=passed,
            sim_to_sim=sim_to_sim,
            sweeps=sweeps,
        )
        _log_html(run, report, plots, ctx)
        crash_point("validate.report_published")
        run.set_tags({"physai.sim_report.digest": report.digest, "physai.gates_passed": passed})
    log.info("validation %s on suite %s", "passed" if passed else "FAILED", suite.config.name)
    return report


def _ran_chunks(cfg: ValidateConfig, policy: Policy, ctx: StageContext) -> dict[str, Any] | None:
    """How the scenes ran the chunks of a policy that emits them (``io.chunk``'s form), or
    None for a policy of one action a step."""
    from edge.runtime import ActionChunks
    from stages.policies.local import stored_chunk_size

    size = stored_chunk_size(ctx.store.open_payload(policy))
    if size is None:
        return None
    how = cfg.chunk.how() if cfg.chunk is not None else {"execute": size}
    return ActionChunks(size, **how).spec()


def _log_extras(run: Any, body: dict[str, Any], scenes: tuple[SceneResult, ...],
                sweeps: tuple[SweepCurve, ...], sim_to_sim: SimToSim | None) -> None:
    """Log the sweeps, the second backend's rates and the critic's verdicts, and add the first
    two to the report's ``body``."""
    if sweeps:
        body["sweeps"] = [c.model_dump() for c in sweeps]
        run.log_dict({"sweeps": body["sweeps"]}, "sweeps.json")
        for curve in sweeps:
            for i, r in enumerate(curve.points):
                run.log_metrics({f"{curve.scene}/sweep/{i}/success_rate": r.success_rate})
    if sim_to_sim is not None:
        body["sim_to_sim"] = sim_to_sim.model_dump()
        other = sim_to_sim.backend
        run.log_params({"compare_backend": other,
                        "compare_backend_version": sim_to_sim.backend_version})
        for r, a in zip(sim_to_sim.scenes, sim_to_sim.agreement, strict=True):
            run.log_metrics({f"{r.scene}/{other}/success_rate": r.success_rate,
                             f"{r.scene}/{other}/difference": a.difference,
                             f"{r.scene}/{other}/p_value": a.p_value})
    verdicts = {r.scene: r.critic.model_dump() for r in scenes if r.critic is not None}
    if verdicts:
        run.log_metrics({"critic/pass_rate": sum(v["passed"] for v in verdicts.values())
                         / len(verdicts)})
        run.log_metrics({f"{scene}/critic_passed": float(v["passed"])
                         for scene, v in verdicts.items()})
        run.log_dict(verdicts, "critic.json")


def _log_plots(run: Any, scenes: tuple[SceneResult, ...], gates: tuple[GateResult, ...],
               sweeps: tuple[SweepCurve, ...], sim_to_sim: SimToSim | None) -> dict[str, Any]:
    """Draw the report's plots (success rates; sweeps and sensitivity when there are any), log
    the last two with the sensitivity ranking, and return them all by name."""
    ranked = {r.scene: [f.model_dump(mode="json") for f in r.factors]
              for r in scenes if r.factors}
    plots = {"success": success_plot(scenes, gates, sim_to_sim)}
    if sweeps:
        plots["sweeps"] = sweep_plot(sweeps)
        run.log_figure(plots["sweeps"], "sweeps.png")
    if ranked:
        plots["sensitivity"] = sensitivity_plot(scenes)
        run.log_dict({"method": SENSITIVITY_METHOD, "scenes": ranked}, "sensitivity.json")
        run.log_figure(plots["sensitivity"], "sensitivity.png")
    return plots


def _sweep_curves(suite: Suite, points: tuple[SceneResult, ...]) -> tuple[SweepCurve, ...]:
    """The sweep points' results grouped into one curve per swept scene, in suite order."""
    curves: list[SweepCurve] = []
    at = 0
    for entry in suite.scenes:
        grid = entry.scene.config.sweep_points()
        if not grid:
            continue
        curves.append(SweepCurve(scene=entry.scene.name, fields=tuple(entry.scene.config.sweep),
                                 points=points[at:at + len(grid)]))
        at += len(grid)
    return tuple(curves)


def sweep_plot(curves: tuple[SweepCurve, ...]) -> Figure:
    """Success rate over each swept scene's grid with 95% Wilson intervals: against the first
    swept field, one line per combination of the others."""
    from stages.evaluation.report_page import panel_grid

    fig, axes = panel_grid(len(curves), 4.4, 3.6)
    for ax, curve in zip(axes, curves, strict=True):
        first, rest = curve.fields[0], curve.fields[1:]
        lines: dict[tuple[float, ...], list[SceneResult]] = {}
        for r in curve.points:
            point = r.sweep or {}
            lines.setdefault(tuple(point[f] for f in rest), []).append(r)
        for key, results in lines.items():
            x = np.array([(r.sweep or {})[first] for r in results])
            y = np.array([r.success_rate for r in results])
            err = np.clip([[r.success_rate - r.ci_low for r in results],
                           [r.ci_high - r.success_rate for r in results]], 0.0, None)
            label = ", ".join(f"{f}={v:g}" for f, v in zip(rest, key, strict=True)) or None
            ax.errorbar(x, y, yerr=err, marker="o", capsize=4, label=label)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel(first)
        ax.set_ylabel("success rate (95% Wilson CI)")
        ax.set_title(f"{curve.scene}: sweep of {', '.join(curve.fields)}", fontsize="medium")
        if rest:
            ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _sim_to_sim(cfg: ValidateConfig, other: str | None, first: tuple[SceneResult, ...],
                second: tuple[SceneResult, ...]) -> SimToSim | None:
    """The second backend's results and their agreement with the first's, if there is one."""
    from stages.evaluation.compare import AGREEMENT_METHOD, compare_backends
    from stages.sim.backends.catalog import backend_version

    if other is None:
        return None
    check = cfg.sim_to_sim
    agreement = compare_backends(first, second, margin=check.margin, alpha=check.alpha)
    return SimToSim(backend=other, backend_version=backend_version(other), margin=check.margin,
                    alpha=check.alpha, method=AGREEMENT_METHOD, scenes=second,
                    agreement=agreement, agrees=all(a.agrees for a in agreement))


def gate_sim_to_sim(cfg: ValidateConfig, check: SimToSim | None) -> tuple[GateResult, ...]:
    """One gate per scene when ``validate.sim_to_sim.gate`` asks: the two backends agree."""
    if check is None or not cfg.sim_to_sim.gate:
        return ()
    return tuple(
        GateResult(name=f"sim_to_sim/{a.scene}", measured=a.p_value, threshold=check.alpha,
                   passed=a.agrees,
                   detail=f"{a.first_successes}/{a.first_episodes} vs {check.backend} "
                   f"{a.second_successes}/{a.second_episodes}, difference {a.difference:+.3f} "
                   f"[{a.difference_ci_low:+.3f}, {a.difference_ci_high:+.3f}], p {a.p_value:.3g}")
        for a in check.agreement)


def _log_html(run: StageRun, report: SimReport, plots: dict[str, Figure],
              ctx: StageContext) -> None:
    """The evaluation report (stages/evaluation/report_page.py) as ``report.html`` in the run, with
    each scene's misses read from its episode table in the store."""
    from stages.evaluation.episodes import read_parquet
    from stages.evaluation.report_page import render_report

    gifs = {s.scene: ctx.store.open_payload(ctx.store.get(s.video_digest)).read_bytes()
            for s in report.scenes if s.video_digest is not None}
    tables = {s.scene: read_parquet(ctx.store.open_payload(ctx.store.get(s.episodes_digest)))
              for s in report.scenes if s.episodes_digest is not None}
    title = f"{ctx.pipeline.config.name}: validation on suite {report.suite}"
    log_page(run, render_report(report, plots, gifs, title, tables), ctx.scratch)


def log_page(run: StageRun, page: str, scratch: Path) -> None:
    """Log the HTML ``page`` as :data:`REPORT_HTML` in ``run``'s artifacts (written under
    ``scratch`` on the way, and removed)."""
    path = scratch / f"report-{run.run_id}" / REPORT_HTML
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    run.log_artifact(path)
    shutil.rmtree(path.parent)


def report_location(lineage: LineageRecorder, run_id: str) -> str:
    """Where run ``run_id``'s :data:`REPORT_HTML` can be opened: a local file where MLflow
    keeps the run's artifacts on this machine (a ``file:`` root, or the artifact folder of the
    ``flows server up`` server), else the artifact's URI."""
    from urllib.parse import unquote, urlparse
    from urllib.request import url2pathname

    from stages.core.settings import resolve_settings

    uri = f"{lineage.call('get_run', run_id).info.artifact_uri.rstrip('/')}/{REPORT_HTML}"
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return url2pathname(unquote(parsed.path))
    if parsed.scheme == "mlflow-artifacts":
        local = resolve_settings().mlflow_artifacts / unquote(parsed.path).lstrip("/")
        if local.is_file():
            return str(local)
    return uri


def _log_episodes(run: StageRun, scenes: tuple[SceneResult, ...], ctx: StageContext) -> None:
    """Upload each scene's per-episode records to the validation run:
    ``episodes/<scene>.parquet``."""
    folder = ctx.scratch / f"episodes-{run.run_id}"
    folder.mkdir(exist_ok=True)
    for s in scenes:
        if s.episodes_digest is None:
            continue
        table = folder / f"{s.scene}.parquet"
        shutil.copyfile(ctx.store.open_payload(ctx.store.get(s.episodes_digest)), table)
        run.log_artifact(table, "episodes")
    shutil.rmtree(folder)


def sensitivity_plot(scenes: tuple[SceneResult, ...]) -> Figure:
    """Per scene, each factor's effect on the log-odds of failure with its 95% interval,
    ranked (a forest plot); factors whose interval excludes zero in red. At most three scenes
    a row, so the figure fits a page 1,400 px wide."""
    from stages.evaluation.report_page import panel_grid

    shown = [s for s in scenes if s.factors]
    rows = max(len(s.factors) for s in shown)
    fig, axes = panel_grid(len(shown), 4.4, 0.35 * rows + 1.6, 0.2)
    for ax, s in zip(axes, shown, strict=True):
        y = np.arange(len(s.factors))[::-1]
        effect = np.array([f.effect for f in s.factors])
        err = np.array([[f.effect - f.ci_low for f in s.factors],
                        [f.ci_high - f.effect for f in s.factors]])
        colors = ["tab:red" if f.ci_low > 0 or f.ci_high < 0 else "tab:gray" for f in s.factors]
        for i, color in enumerate(colors):
            ax.errorbar(effect[i], y[i], xerr=err[:, i:i + 1], fmt="o", color=color, capsize=3)
        ax.axvline(0.0, color="k", linewidth=0.8)
        ax.set_yticks(y, [f.name for f in s.factors], fontsize="small")
        ax.set_title(f"{s.scene}: {s.episodes - s.successes}/{s.episodes} failed",
                     fontsize="medium")
        ax.set_xlabel("log-odds of failure per SD (95% interval)")
    fig.tight_layout()
    return fig


def _log_videos(run: StageRun, scenes: tuple[SceneResult, ...], ctx: StageContext,
                suffix_name: str = "") -> None:
    """Upload each scene's rollout GIF and USD stage to the validation run, beside each other:
    ``videos/<scene>.gif`` and ``videos/<scene>.usda`` (``<scene>-<backend>`` on a suite's
    second backend)."""
    folder = ctx.scratch / f"videos-{run.run_id}{suffix_name}"
    folder.mkdir(exist_ok=True)
    for s in scenes:
        for digest, suffix in ((s.video_digest, ".gif"), (s.usd_digest, ".usda")):
            if digest is None:
                continue
            clip = folder / f"{s.scene}{suffix_name}{suffix}"
            shutil.copyfile(ctx.store.open_payload(ctx.store.get(digest)), clip)
            run.log_artifact(clip, "videos")
    shutil.rmtree(folder)


def validate(cfg: ValidateConfig, policy: Policy, ctx: StageContext) -> SimReport:
    """Evaluate ``policy`` on every scene of the suite, one after the other, and report."""
    count = len(ctx.pipeline.suite.scenes)
    scenes = tuple(validate_scene(cfg, policy, i, ctx) for i in range(count))
    return assemble_report(cfg, policy, scenes, ctx)


def success_plot(scenes: tuple[SceneResult, ...], gates: tuple[GateResult, ...],
                 sim_to_sim: SimToSim | None = None) -> Figure:
    """Bar chart of success rate per scene with 95% intervals and the gate thresholds; with a
    sim-to-sim check, the second backend's bar beside each (hatched where they disagree)."""
    from matplotlib.figure import Figure

    from stages.evaluation.report_page import PAGE_WIDTH_IN

    fig = Figure(figsize=(min(max(1.6 * len(scenes) + 2, 5.2), PAGE_WIDTH_IN), 3.8), dpi=100)
    ax = fig.add_subplot()
    x = np.arange(len(scenes))
    width = 0.8 if sim_to_sim is None else 0.4

    def bars(results: tuple[SceneResult, ...], at: np.ndarray, **style: Any) -> None:
        rates = np.array([s.success_rate for s in results])
        err = np.clip([[s.success_rate - s.ci_low for s in results],
                       [s.ci_high - s.success_rate for s in results]], 0.0, None)
        ax.bar(at, rates, width, yerr=err, capsize=6, alpha=0.8, **style)

    colors = ["tab:green" if g.passed else "tab:red" for g in gates[:len(scenes)]]
    first = x if sim_to_sim is None else x - width / 2
    bars(scenes, first, color=colors, label=scenes[0].backend if sim_to_sim else None)
    if sim_to_sim is not None:
        hatch = ["" if a.agrees else "//" for a in sim_to_sim.agreement]
        bars(sim_to_sim.scenes, x + width / 2, color="tab:blue", hatch=hatch,
             label=f"{sim_to_sim.backend} (hatched: disagrees)")
        ax.legend(loc="lower left", fontsize="small")
    for i, g in enumerate(gates[:len(scenes)]):
        ax.hlines(g.threshold, i - 0.4, i + 0.4, colors="k", linestyles="dashed")
    ax.set_xticks(x, [s.scene for s in scenes], rotation=15)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% Wilson CI)")
    ax.set_title("validation per scene (dashed: gate on lower bound)")
    fig.tight_layout()
    return fig
