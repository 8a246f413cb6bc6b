"""The pipeline flow: [teacher ->] [collect ->] train -> validate -> package -> promote, wired
from the stage table, nothing more."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.dispatch import RemoteStages
from flows.stage_tasks import (
    StageRunner,
    deployed_config,
    finish_run,
    resolve_expert_task,
    run_stage,
    start_run,
)
from stages.orchestration.stage_table import STAGES
from stages.pipeline.config import ResolvedPipeline, load_pipeline
from stages.pipeline.run import PipelineResult


@flow(name="pipeline", flow_run_name="{config_path}", task_runner=ThreadPoolTaskRunner())  # type: ignore[arg-type]
def pipeline_flow(
    config_path: str, refresh: bool = False, dispatch: bool = False
) -> PipelineResult:
    """Take a robot skill from data to a promoted, packaged model; unchanged stages are cached.

    With ``dispatch``, every stage runs as a flow run on its computer's work pool
    (:mod:`flows.dispatch`); ``flows deploy`` must have deployed them and workers must poll.
    A run of a deployment refuses a config outside its project folder.
    """
    pipeline = load_pipeline(deployed_config(config_path))
    run_id = start_run(pipeline)
    if dispatch:
        remote = RemoteStages(pipeline, config_path, run_id, refresh)
        return _wire(pipeline, run_id, lambda stage, done: remote(stage, **done), remote.cached)
    runner = StageRunner(refresh)
    return _wire(pipeline, run_id,
                 lambda stage, done: run_stage(runner, stage, pipeline, run_id, done),
                 runner.cached)


def _wire(
    pipeline: ResolvedPipeline, run_id: str, run: Callable[[str, dict[str, Any]], Any],
    cached: list[str],
) -> PipelineResult:
    """Run the pipeline's stages in table order, each on the results its inputs name."""
    done: dict[str, Any] = {}
    if pipeline.config.teacher is None:
        done["teacher"] = resolve_expert_task(pipeline, run_id)
    for stage in STAGES:
        if stage.name in pipeline.stages:
            done[stage.output] = run(stage.name, {r: done.get(r) for r in stage.inputs})
    return finish_run(pipeline, run_id, done, tuple(cached))
