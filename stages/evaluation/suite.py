"""Evaluating a policy: one scene (all its episodes at once, or a chunk of worlds at a time
under a sequential gate), every scene of a suite, every sweep point; the per-scene results
with their Wilson intervals, factors and failure modes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stages.artifacts.records import SceneResult, SequentialVerdict, SweepCurve
from stages.evaluation.gates import sequential_design
from stages.evaluation.rollout import Rollout, VideoSpec, chunk_runner, rollout
from stages.evaluation.sensitivity import factor_effects
from stages.evaluation.stats import wilson_interval
from stages.orchestration.context import Progress, current_progress
from stages.policies.local import PolicyFn, run_chunks
from stages.sections.models import ChunkConfig, ValidateConfig
from stages.sim.env.batched import BatchedEnv
from stages.sim.tasks.catalog import get_task

if TYPE_CHECKING:
    from stages.evaluation.sequential import Design
    from stages.sim.suites.suite import Suite


@dataclass(frozen=True)
class Evaluation:
    """One policy over one suite: per-scene results and, for validate, the gates."""

    policy: str
    digest: str
    kind: str
    suite: Suite
    scenes: tuple[SceneResult, ...]
    latency_ms: dict[str, float]
    """A remote policy's call latencies (calls, p50_ms, p99_ms, max_ms); empty otherwise."""
    sweeps: tuple[SweepCurve, ...] = ()
    """For validate, the success curve of every swept scene (``sweep:`` in its file)."""
    rollouts: Mapping[str, Rollout] = field(default_factory=dict)
    """Each scene's rollout by scene name (its episode table, what a policy that sees was
    shown), where the suite ran in this process."""


Instructions = Callable[[int, int], Sequence[str] | None]
"""The instructions of a scene's episodes: ``(worlds, seed) ->`` one text a world, or None
(:func:`~stages.sim.scenes.scene.episode_instructions` of the scene)."""


def evaluate_scene(
    env: BatchedEnv, act: PolicyFn, scene: str, episodes: int, video: VideoSpec | None = None,
    instructions: Sequence[str] | None = None,
) -> tuple[SceneResult, Rollout]:
    """Success rate with a 95% Wilson interval and mean return for one scene, and the rollout
    (its frames and poses); ``instructions``, one a world, as :func:`rollout` gives them."""
    out = rollout(env, act, video, instructions)
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
    instructions: Instructions | None = None,
) -> tuple[SceneResult, Rollout]:
    """:func:`evaluate_scene` a chunk of worlds at a time until ``design`` reaches a verdict;
    ``make_env(worlds, seed)`` builds a chunk, the first from ``seed`` (its worlds are the first
    of the scene's fixed run where the backend seeds world i from the i-th number of
    ``SeedSequence(seed)``), chunk ``i`` from ``SeedSequence([seed, i])``.
    The first chunk is filmed; ``advance(episodes, success_rate)`` follows every chunk;
    ``instructions(worlds, seed)`` gives each chunk's episodes their instructions."""
    from stages.evaluation.sequential import METHOD

    parts: list[Rollout] = []
    seen = successes = 0
    verdict = None
    for index, look in enumerate(design.looks):
        chunk_seed = seed if index == 0 else \
            int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
        env = make_env(look - seen, chunk_seed)
        told = instructions(look - seen, chunk_seed) if instructions is not None else None
        parts.append(rollout(env, act, video if index == 0 else None, told))
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

    Steps: 1. the policy's chunks as ``chunk`` or ``gates`` say; 2. each scene, under its
    sequential design a chunk of worlds at a time, else all its episodes at once; 3. its
    rollout kept by name where asked.
    """
    from stages.sim.backends.catalog import make_backend_env
    from stages.sim.scenes.scene import episode_instructions

    # -- 1. the policy's chunks
    if chunk is not None:
        act = run_chunks(act, chunk.how())
    act = chunk_runner(act, gates)
    spec = get_task(suite.config.task)
    progress = progress or current_progress()
    backend = suite.config.backend
    results = []
    for scene, count, seed in suite.scenes:
        # -- 2. the scene, sequentially or all at once
        n = episodes or count
        design = sequential_design(gates, scene.config.name, n)
        with progress.bar(f"{label} {scene.config.name}", n) as bar:
            if design is not None:
                def chunk_env(worlds: int, chunk_seed: int, scene: Any = scene) -> BatchedEnv:
                    return make_backend_env(backend, spec, scene, worlds, chunk_seed,
                                            device=device)

                def told(worlds: int, chunk_seed: int, scene: Any = scene
                         ) -> Sequence[str] | None:
                    return episode_instructions(scene.config, worlds, chunk_seed)

                result, out = evaluate_scene_sequential(
                    chunk_env, act, scene.config.name, seed + seed_offset, design,
                    advance=lambda k, rate: bar.advance(k, success=f"{rate:.2f}"),
                    instructions=told)
            else:
                env = make_backend_env(backend, spec, scene, n, seed + seed_offset,
                                       device=device)
                result, out = evaluate_scene(
                    env, act, scene.config.name, n, instructions=episode_instructions(
                        scene.config, n, seed + seed_offset))
                bar.advance(n, success=f"{result.success_rate:.2f}")
                env.close()
        results.append(result)
        # -- 3. its rollout kept
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
    from stages.sim.scenes.scene import episode_instructions, point_label, sweep_variant

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
            result, _ = evaluate_scene(env, act, entry.scene.name, n, instructions=(
                episode_instructions(scene.config, n, entry.seed)))
            bar.advance(n, success=f"{result.success_rate:.2f}")
        env.close()
        points.append(result.model_copy(update={"backend": suite.config.backend,
                                                "sweep": point}))
    return sweep_curves(suite, tuple(points))


def sweep_curves(suite: Suite, points: tuple[SceneResult, ...]) -> tuple[SweepCurve, ...]:
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


def scene_environment(cfg: ValidateConfig, backend: str) -> str | None:
    """The stage environment a scene on ``backend`` runs in: ``validate.environment``, else the
    one the backend implies, else None (this process)."""
    from stages.sim.backends.catalog import get_backend

    return cfg.environment or get_backend(backend).environment
