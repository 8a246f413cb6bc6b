"""A pipeline run's MLflow parent run and the context its stages share, made from the resolved
pipeline: the one place that turns a :class:`~stages.pipeline.config.ResolvedPipeline` into a
:class:`~stages.orchestration.context.StageContext` (which knows no pipeline)."""

from __future__ import annotations

from stages.core.settings import Settings
from stages.orchestration.context import (
    Progress,
    StageContext,
    code_revision,
    open_services,
)
from stages.orchestration.stage_table import STAGES
from stages.pipeline.config import ResolvedPipeline
from stages.training.context import TrainingContext


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
    """The context the stages of run ``run_id`` share: the services, the pipeline's name, seed
    and file, and the digest of each of its stages' configs (their producer records)."""
    settings, store, lineage = open_services(settings)
    digests = {s.name: pipeline.stage_digest(s.name) for s in STAGES if s.name in pipeline.stages}
    return StageContext(pipeline.config.name, pipeline.config.seed, pipeline.path, digests,
                        settings, store, lineage, run_id, progress)


def training_context(pipeline: ResolvedPipeline, ctx: StageContext,
                     stage: str) -> TrainingContext:
    """``ctx`` with what training stage ``stage`` of ``pipeline`` works on: the task, the
    stage's scene and its digest, and the collect section and scene (DAgger records there)."""
    scene, digest = {
        "train": (pipeline.train_scene, pipeline.train_scene_digest),
        "teacher": (pipeline.teacher_scene, pipeline.teacher_scene_digest),
    }.get(stage, (None, None))
    return TrainingContext.of(
        ctx, task=pipeline.task, scene=scene, scene_digest=digest,
        collect=pipeline.config.collect, collect_scene=pipeline.collect_scene,
        collect_scene_digest=pipeline.collect_scene_digest)
