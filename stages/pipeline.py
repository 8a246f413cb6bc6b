"""Pipeline-level pieces shared by the Prefect flow and direct calls: run bookkeeping, cache keys,
the summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stages import collect, package, promote, train, validate
from stages.artifacts import ArtifactBase, Dataset, EdgeBundle, Policy, Promotion, SimReport
from stages.config import ResolvedPipeline
from stages.context import Progress, StageContext, code_revision, open_services
from stages.hashing import sha256_json
from stages.lineage import StageRun
from stages.settings import Settings

STAGE_VERSIONS = {
    "collect": collect.STAGE_VERSION,
    "train": train.STAGE_VERSION,
    "validate": validate.STAGE_VERSION,
    "package": package.STAGE_VERSION,
    "promote": promote.STAGE_VERSION,
}


def stage_key(stage: str, pipeline: ResolvedPipeline, parents: Sequence[ArtifactBase]) -> str:
    """Cache key of a stage: hash(stage, stage version, its config, its parents' digests)."""
    return f"physai-{stage}-" + sha256_json(
        {
            "stage": stage,
            "version": STAGE_VERSIONS[stage],
            "config": pipeline.stage_digest(stage),
            "parents": [p.digest for p in parents],
        }
    )


def scene_key(pipeline: ResolvedPipeline, policy: ArtifactBase, index: int) -> str:
    """Cache key of one validation scene: the scene's bytes, assets, simulator, episodes, seed
    and the policy, so editing one scene re-runs only that scene."""
    from stages.config import scene_digest
    from stages.sim.tasks import get_task

    scene, episodes, seed = pipeline.suite.scenes[index]
    return "physai-validate-scene-" + sha256_json(
        {
            "version": validate.STAGE_VERSION,
            "scene": scene_digest(scene.path, get_task(pipeline.config.task).asset_files),
            "episodes": episodes,
            "seed": seed,
            "policy": policy.digest,
        }
    )


def start_pipeline(pipeline: ResolvedPipeline, settings: Settings | None = None) -> str:
    """Open the parent MLflow run of one pipeline run; returns its id."""
    settings, _, lineage = open_services(settings)
    cfg = pipeline.config
    run = lineage.start_run(
        cfg.name,
        f"{cfg.name}-pipeline",
        tags={"physai.config_digest": pipeline.config_digest,
              "physai.config_path": str(pipeline.path),
              "physai.code_revision": code_revision()},
    )
    run.log_params({"task": cfg.task, "seed": cfg.seed, "config_path": pipeline.path})
    run.log_dict(cfg.model_dump(mode="json", by_alias=True), "resolved_config.json")
    return run.run_id


def stage_context(
    pipeline: ResolvedPipeline, run_id: str, progress: Progress, settings: Settings | None = None
) -> StageContext:
    """The context stages of run ``run_id`` share."""
    settings, store, lineage = open_services(settings)
    return StageContext(pipeline, settings, store, lineage, run_id, progress)


@dataclass(frozen=True)
class PipelineResult:
    """Everything one pipeline run produced."""

    run_id: str
    run_url: str
    dataset: Dataset
    policy: Policy
    report: SimReport
    bundle: EdgeBundle
    promotion: Promotion
    cached: tuple[str, ...] = ()


def finish_pipeline(
    ctx: StageContext, artifacts: Sequence[ArtifactBase], promotion: Promotion,
    cached: Sequence[str] = (),
) -> str:
    """Tag and end the parent run; returns the run's MLflow URL."""
    tags = {f"physai.{a.kind}.digest": a.digest for a in artifacts}
    tags["physai.model"] = f"{promotion.model_name}/{promotion.version}"
    tags["physai.promoted"] = str(promotion.promoted).lower()
    tags["physai.cached_stages"] = ",".join(cached) or "none"
    StageRun(ctx.lineage, ctx.pipeline_run_id).set_tags(tags)
    ctx.lineage.end_run(ctx.pipeline_run_id)
    return ctx.lineage.run_url(ctx.pipeline_run_id)


def run_direct(pipeline: ResolvedPipeline, progress: Progress) -> PipelineResult:
    """Run every stage in this process without Prefect and without caching."""
    run_id = start_pipeline(pipeline)
    ctx = stage_context(pipeline, run_id, progress)
    cfg = pipeline.config
    dataset = collect.collect(cfg.collect, ctx)
    policy = train.train(cfg.train, dataset, ctx)
    report = validate.validate(cfg.validate_, policy, ctx)
    bundle = package.package(cfg.package, policy, report, ctx)
    promotion = promote.promote(cfg.promote, policy, report, bundle, ctx)
    url = finish_pipeline(ctx, (dataset, policy, report, bundle), promotion)
    return PipelineResult(run_id, url, dataset, policy, report, bundle, promotion)


def summary_markdown(result: PipelineResult) -> str:
    """A markdown summary of one pipeline run: scenes, gates, latency, model version."""
    r, b, p = result.report, result.bundle, result.promotion
    lines = [
        f"# Pipeline run `{result.run_id}`",
        "",
        f"MLflow run: {result.run_url}",
        "",
        "| scene | episodes | success | 95% CI | mean return | gate |",
        "|---|---|---|---|---|---|",
    ]
    gates = {g.name: g for g in r.gates}
    for s in r.scenes:
        g = gates.get(f"success/{s.scene}")
        verdict = "pass" if g is not None and g.passed else "FAIL"
        lines.append(
            f"| {s.scene} | {s.episodes} | {s.success_rate:.3f} | "
            f"[{s.ci_low:.3f}, {s.ci_high:.3f}] | {s.mean_return:.2f} | {verdict} |"
        )
    lines += [
        "",
        f"- latency (ONNX Runtime, CPU, batch 1): p50 {b.latency_p50_us:.1f} us, "
        f"p99 {b.latency_p99_us:.1f} us",
        f"- ONNX parity max |diff|: {b.parity_max_abs_diff:.2e}",
        f"- model: `models:/{p.model_name}/{p.version}`"
        + (f" is now `@{p.alias}`" if p.promoted else f", `@{p.alias}` not moved"),
    ]
    lines += [f"  - not promoted: {reason}" for reason in p.reasons]
    lines.append(f"- against the champion: {p.comparison}")
    if result.cached:
        lines.append(f"- cached stages: {', '.join(result.cached)}")
    lines += ["", "| artifact | digest |", "|---|---|"]
    lines += [f"| {a.kind} | `{a.digest}` |" for a in (result.dataset, result.policy, r, b)]
    return "\n".join(lines) + "\n"
