"""The pipeline flow: [teacher ->] [collect ->] train -> validate -> package -> promote, wired,
nothing more."""

from __future__ import annotations

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.dispatch import RemoteStages
from flows.tasks import (
    StageRunner,
    collect_task,
    finish_run,
    package_task,
    promote_task,
    resolve_expert_task,
    start_run,
    teacher_task,
    train_task,
    validate_scene_task,
    validate_task,
)
from stages.artifacts import Policy
from stages.config import ResolvedPipeline, load_pipeline
from stages.pipeline import PipelineResult


@flow(name="pipeline", flow_run_name="{config_path}", task_runner=ThreadPoolTaskRunner())  # type: ignore[arg-type]
def pipeline_flow(
    config_path: str, refresh: bool = False, dispatch: bool = False
) -> PipelineResult:
    """Take a robot skill from data to a promoted, packaged model; unchanged stages are cached.

    With ``dispatch``, every stage runs as a flow run on its computer's work pool
    (:mod:`flows.dispatch`); ``flows deploy`` must have deployed them and workers must poll.
    """
    pipeline = load_pipeline(config_path)
    run_id = start_run(pipeline)
    if dispatch:
        return _dispatched(pipeline, config_path, run_id, refresh)
    stage = StageRunner(refresh)
    cfg = pipeline.config
    teacher: Policy | None
    if cfg.teacher is not None:
        teacher = stage(teacher_task, pipeline, run_id)
    else:
        teacher = resolve_expert_task(pipeline, run_id)
    dataset = stage(collect_task, pipeline, run_id, teacher) if cfg.collect is not None else None
    policy = stage(train_task, pipeline, run_id, dataset)
    scenes = stage.each_scene(validate_scene_task, pipeline, run_id, policy)
    report = stage(validate_task, pipeline, run_id, policy, scenes)
    bundle = stage(package_task, pipeline, run_id, policy, report)
    promotion = stage(promote_task, pipeline, run_id, policy, report, bundle)
    return finish_run(
        pipeline, run_id, dataset, policy, report, bundle, promotion, tuple(stage.cached),
        teacher,
    )


def _dispatched(
    pipeline: ResolvedPipeline, config_path: str, run_id: str, refresh: bool
) -> PipelineResult:
    """The same stages, each one a flow run on its computer's pool; only digests travel."""
    remote = RemoteStages(pipeline, config_path, run_id, refresh)
    cfg = pipeline.config
    teacher: Policy | None
    if cfg.teacher is not None:
        teacher = remote("teacher")
    else:
        teacher = resolve_expert_task(pipeline, run_id)
    dataset = remote("collect", teacher=teacher) if cfg.collect is not None else None
    policy = remote("train", dataset=dataset)
    report = remote("validate", policy=policy)
    bundle = remote("package", policy=policy, report=report)
    promotion = remote("promote", policy=policy, report=report, bundle=bundle)
    return finish_run(
        pipeline, run_id, dataset, policy, report, bundle, promotion, tuple(remote.cached),
        teacher,
    )
