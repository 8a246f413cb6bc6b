"""The validate stage: roll the policy out over a frozen scene suite and apply the gates.

The evaluation itself lives in :mod:`stages.evaluation` (the rollout engine, a suite's
evaluation, the gates, the report); this module is the stage: one scene of the suite
(:func:`validate_scene`, which the flow fans out), its records published to the store, and
the report assembled from every scene (:func:`assemble_report`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from stages.artifacts.records import (
    EpisodeRecords,
    Policy,
    RolloutUsd,
    RolloutVideo,
    SceneResult,
    SimReport,
)
from stages.core.crash import crash_point
from stages.evaluation.episodes import write_parquet
from stages.evaluation.gates import (
    gate_critic,
    gate_scenes,
    gate_sim_to_sim,
    scene_sequential,
    sim_to_sim_check,
)
from stages.evaluation.plots import beside_seen
from stages.evaluation.reporting import (
    critique,
    log_episodes,
    log_extras,
    log_plots,
    log_report_page,
    log_scene_metrics,
    log_videos,
)
from stages.evaluation.rollout import Rollout, VideoSpec, chunk_runner
from stages.evaluation.suite import (
    evaluate_scene,
    evaluate_scene_sequential,
    scene_environment,
    sweep_curves,
)
from stages.evaluation.usd import write_rollout_usd
from stages.evaluation.video import write_gif
from stages.orchestration.context import StageContext
from stages.orchestration.envcall import placed, validate_scene_in
from stages.policies.local import load_actor
from stages.sections.models import ValidateConfig
from stages.sim.env.batched import BatchedEnv
from stages.sim.env.overlap import grouped_env
from stages.sim.tasks.catalog import TaskSpec, get_task

if TYPE_CHECKING:
    from stages.sim.suites.suite import Suite

log = logging.getLogger(__name__)

STAGE_VERSION = "4"


def _scene_index_environment(cfg: ValidateConfig, policy: Policy, index: int,
                             ctx: StageContext, suite: Suite) -> str | None:
    """The stage environment scene ``index`` runs in (:func:`scene_environment`)."""
    backend, _ = suite.run(index)
    return scene_environment(cfg, backend)


@placed(_scene_index_environment, validate_scene_in)
def validate_scene(
    cfg: ValidateConfig, policy: Policy, index: int, ctx: StageContext, suite: Suite
) -> SceneResult:
    """Evaluate ``policy`` on scene ``index`` of ``suite``, with its episode count and seed.

    ``index`` counts the suite's :attr:`~stages.sim.scenes.scene.Suite.runs`: every scene on its
    backend, then (with ``compare_backend``) every scene on the second one. Scenes are
    independent, so the flow fans them out in parallel and caches each on its own. The first
    episodes are filmed and the GIF is published to the store. With ``validate.environment``,
    or on a backend that implies one (Isaac Lab), the scene runs in that stage environment's
    interpreter.

    Steps: 1. the scene's run (backend, episodes, seed), the policy as validation runs it and
    what to film; 2. the episodes, under the scene's sequential design a chunk of worlds at a
    time, else all at once in overlapped groups; 3. the chunk policy's queries logged; 4. the
    episode table, GIF, USD stage and critic's verdict published.
    """
    from stages.sim.backends.catalog import make_backend_env
    from stages.sim.scenes.scene import episode_instructions

    # -- 1. the scene's run, the policy and what to film

    backend, (scene, episodes, seed) = suite.run(index)
    spec = get_task(policy.task)
    act = chunk_runner(load_actor(ctx.store.open_payload(policy)), cfg,
                       where=str(ctx.config_path))
    point = suite.sweep_point(index)
    video = None
    if cfg.video_episodes and point is None:
        video = VideoSpec(cfg.video_episodes, *cfg.video_size, cfg.video_every, spec.camera)
    label = scene.config.name if index < len(suite.scenes) else \
        f"{scene.config.name} on {backend}"
    if point is not None:
        from stages.sim.scenes.scene import point_label

        label = f"{scene.config.name} at {point_label(point)}"
    # -- 2. the episodes
    design = scene_sequential(cfg, suite, index)
    with ctx.progress.bar(f"validate {label}", episodes) as bar:
        if design is not None:
            def chunk_env(worlds: int, chunk_seed: int) -> BatchedEnv:
                return make_backend_env(backend, spec, scene, worlds, chunk_seed,
                                        device=cfg.device, camera_tiles=cfg.camera_tiles)

            result, out = evaluate_scene_sequential(
                chunk_env, act, scene.config.name, seed, design, video,
                advance=lambda n, rate: bar.advance(n, success=f"{rate:.2f}"),
                instructions=lambda n, s: episode_instructions(scene.config, n, s))
        else:
            env = grouped_env(lambda n, s, threads: make_backend_env(
                backend, spec, scene, n, s, num_threads=threads, device=cfg.device,
                camera_tiles=cfg.camera_tiles), episodes, seed, min(cfg.overlap_groups, episodes))
            try:
                result, out = evaluate_scene(env, act, scene.config.name, episodes, video,
                                             episode_instructions(scene.config, episodes, seed))
            finally:
                env.close()
            bar.advance(episodes, success=f"{result.success_rate:.2f}")
    result = result.model_copy(update={"backend": backend, "sweep": point})
    # -- 3. the chunk policy's queries
    if out.queries is not None:
        log.info("scene %s: %d queries of the policy's chunks (%s) for %d steps of %d worlds; "
                 "one query p50 %.3f ms, p99 %.3f ms", label, out.queries,
                 getattr(act, "spec", {}), scene.config.episode_steps, episodes,
                 (out.query_latency_ms or {}).get("p50", 0.0),
                 (out.query_latency_ms or {}).get("p99", 0.0))
    # -- 4. the scene's records published
    crash_point(f"validate.scene_evaluated.{scene.config.name}")
    name = f"{scene.config.name}-{backend}-{policy.digest[:12]}-{seed}"
    if point is not None:
        from stages.core.hashing import sha256_json

        name += "-sweep-" + sha256_json(point)[:12]
    filmed = 0 if video is None else \
        min(video.episodes, design.looks[0] if design is not None else episodes)
    return _publish_scene(cfg, policy, spec, scene.config.name, name, result, out, video,
                          filmed, ctx)


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
        result = result.model_copy(update={"critic": critique(cfg.critic, spec, scene,
                                                              filmed, out, video)})
    if out.poses is not None and out.layout is not None:
        path = ctx.scratch / f"{name}.usda"
        write_rollout_usd(path, out.layout, out.poses, fps=spec.control_hz)
        stage = ctx.publish(path, RolloutUsd, "validate", STAGE_VERSION, parents, None,
                            scene=scene, episodes=filmed, steps=len(out.poses))
        result = result.model_copy(update={"usd_digest": stage.digest})
    return result


def validate(cfg: ValidateConfig, policy: Policy, ctx: StageContext, suite: Suite) -> SimReport:
    """Evaluate ``policy`` on every scene of ``suite``, one after the other, and report."""
    count = len(suite.scenes)
    scenes = tuple(validate_scene(cfg, policy, i, ctx, suite) for i in range(count))
    return assemble_report(cfg, policy, scenes, ctx, suite)


def assemble_report(
    cfg: ValidateConfig, policy: Policy, scenes: tuple[SceneResult, ...], ctx: StageContext,
    suite: Suite,
) -> SimReport:
    """Gate the per-scene results of ``suite``, log them with a plot to MLflow and publish the
    report.

    Steps: 1. the suite's runs split (its own backend's scenes, the second backend's, the sweep
    points) and checked against each other; 2. the gates; 3. the MLflow run: parameters,
    metrics, the report JSON, videos, episode tables and plots; 4. the report published to the
    store and its page logged in the run.
    """
    from stages.sim.backends.catalog import backend_version

    # -- 1. the suite's runs split
    backend = suite.config.backend
    version = backend_version(backend)
    n = len(suite.scenes)
    plain = n * len(suite.backends)
    scenes, second, swept = scenes[:n], scenes[n:plain], scenes[plain:]
    sim_to_sim = sim_to_sim_check(cfg, suite.config.compare_backend, scenes, second)
    sweeps = sweep_curves(suite, swept)
    # -- 2. the gates
    gates = gate_scenes(cfg, scenes) + gate_critic(cfg, scenes) + gate_sim_to_sim(cfg, sim_to_sim)
    passed = all(g.passed for g in gates)
    with ctx.lineage.stage_run(ctx.experiment, "validate", ctx.pipeline_run_id, {}) as run:
        # -- 3. the MLflow run
        run.log_params({"suite": suite.config.name, "suite_digest": suite.digest,
                        "min_success": cfg.min_success, "backend": backend,
                        "backend_version": version})
        log_scene_metrics(run, scenes)
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
        log_extras(run, body, scenes, sweeps, sim_to_sim)
        chunk = _ran_chunks(cfg, policy, ctx)
        if chunk is not None:
            body["chunk"] = chunk
            run.log_params({"chunk": json.dumps(chunk, sort_keys=True)})
        run.log_dict(body, "sim_report.json")
        log_videos(run, scenes, ctx.store, ctx.scratch)
        log_episodes(run, scenes, ctx.store, ctx.scratch)
        plots = log_plots(run, scenes, gates, sweeps, sim_to_sim)
        if sim_to_sim is not None:
            log_videos(run, sim_to_sim.scenes, ctx.store, ctx.scratch,
                       f"-{sim_to_sim.backend}")
        run.log_figure(plots["success"], "success_rates.png")
        # -- 4. the report published, its page logged
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
        title = f"{ctx.experiment}: validation on suite {report.suite}"
        log_report_page(run, report, plots, title, ctx.store, ctx.scratch)
        crash_point("validate.report_published")
        run.set_tags({"physai.sim_report.digest": report.digest, "physai.gates_passed": passed})
    log.info("validation %s on suite %s", "passed" if passed else "FAILED", suite.config.name)
    return report


def _ran_chunks(cfg: ValidateConfig, policy: Policy, ctx: StageContext) -> dict[str, Any] | None:
    """How the scenes ran the chunks of a policy that emits them (``io.chunk``'s form), or
    None for a policy of one action a step."""
    from stages.evaluation.rollout import chunk_spec
    from stages.policies.local import stored_chunk_size

    payload = ctx.store.open_payload(policy)
    if stored_chunk_size(payload) is None:
        return None
    return chunk_spec(load_actor(payload), cfg)  # as the scenes ran it: declared or validate.chunk
