"""Prefect tasks wrapping the stages: names, caching and retries live here, logic in ``stages``."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from prefect import Task, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.context import FlowRunContext, TaskRunContext
from prefect.states import State

from physai_core.errors import ConfigError, Problem, TransientError
from stages.artifacts.records import (
    ArtifactBase,
    GateResult,
    Policy,
    SceneResult,
    SimReport,
)
from stages.core.crash import crash_point
from stages.core.redaction import shown
from stages.core.resources import inside_folder
from stages.evaluation.reporting import REPORT_HTML
from stages.orchestration.context import StageContext, current_progress, open_services
from stages.orchestration.stage_table import STAGES, StageDef, stage_def
from stages.pipeline.config import ResolvedPipeline
from stages.pipeline.run import (
    PipelineResult,
    finish_pipeline,
    resolve_expert,
    scene_key,
    stage_key,
    summary_markdown,
)
from stages.pipeline.session import stage_context, start_pipeline
from stages.steps import validate

log = logging.getLogger(__name__)
R = TypeVar("R")


def project_config(config_path: str, project: Path) -> str:
    """``config_path`` when it names a file inside the folder ``project`` (relative to it or
    absolute, symlinks followed); otherwise one line, before anything is read.

    Raises:
        ConfigError: ``config_path`` leads outside ``project``.
    """
    try:
        inside_folder(config_path, project)
    except ValueError as exc:
        raise ConfigError([shown(Problem(
            "flow run", "config_path", config_path,
            f"{exc}; a deployment runs only configs inside the project folder it was "
            "deployed from"))]) from None
    return config_path


def deployed_config(config_path: str) -> str:
    """``config_path`` as this flow run may read it: in a run of a deployment, only a config
    inside the project folder the deployment runs in (its working directory, set by the
    deployment's pull step, which a flow run cannot change), so that whoever may start a flow
    run cannot have a worker read its other files into logs; any config in a run started here
    (``flows run``)."""
    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    if run is None or run.deployment_id is None:
        return config_path
    return project_config(config_path, Path.cwd())


def _cache_key(stage: str) -> Callable[[TaskRunContext, dict[str, Any]], str]:
    """The cache key of ``stage``'s task: its stage key over the artifacts among its
    parameters, in the table's order of roles."""
    def key(_: TaskRunContext, params: dict[str, Any]) -> str:
        roles = (s.output for s in STAGES)
        parents = [params[r] for r in roles if isinstance(params.get(r), ArtifactBase)]
        return stage_key(stage, params["pipeline"], parents, params.get("scenes") or ())

    return key


def _transient(_: Task[Any, Any], __: Any, state: State[Any]) -> bool:
    try:
        state.result()
    except TransientError:
        return True
    except Exception:
        return False
    return False


def make_stage_task(defn: StageDef) -> Task[..., Any]:
    """The Prefect task of the stage ``defn``, named after it: cached by its stage key, JSON
    results, transient faults retried.

    The task takes ``(pipeline, run_id, *inputs)``, one input per role of the stage's
    :attr:`~stages.orchestration.stage_table.StageDef.inputs`, by those names (the cache key reads
    them); a per-scene stage also takes its scene results last, as ``scenes``. It runs the stage's
    runner in a stage context and attaches what a flow run shows of its result.
    """
    names = ["pipeline", "run_id", *defn.inputs, *(("scenes",) if defn.per_scene else ())]
    signature = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])

    def run(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs).arguments
        pipeline: ResolvedPipeline = bound["pipeline"]
        ctx = stage_context(pipeline, bound["run_id"], current_progress())
        result = defn.run(pipeline, ctx, *(bound[n] for n in names[2:]))
        _show(pipeline, ctx, result)
        return result

    run.__signature__ = signature  # type: ignore[attr-defined]
    run.__name__ = run.__qualname__ = f"{defn.name}_task"
    run.__module__ = __name__
    run.__doc__ = f"The {defn.name} stage ({defn.computer}): {defn.output} from " \
        f"{', '.join(defn.inputs) or 'nothing upstream'}."
    made: Task[..., Any] = task(
        name=defn.name,
        cache_key_fn=_cache_key(defn.name),
        persist_result=True,
        result_serializer="json",
        retries=2,
        retry_delay_seconds=[2, 10],
        retry_condition_fn=_transient,
    )(run)
    return made


STAGE_TASKS: dict[str, Task[..., Any]] = {s.name: make_stage_task(s) for s in STAGES}
"""The Prefect task of each stage of :data:`stages.orchestration.stage_table.STAGES`, by stage name;
each is also this module's attribute ``<stage>_task`` (``collect_task``, ...)."""


def __getattr__(name: str) -> Task[..., Any]:
    """``<stage>_task``: the Prefect task of that stage of the table."""
    stage = name.removesuffix("_task")
    if name.endswith("_task") and stage in STAGE_TASKS:
        return STAGE_TASKS[stage]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def stage_task(stage: str) -> Task[..., Any]:
    """The Prefect task of the stage named ``stage``; one added to the table after this module
    was imported is made on first use. An unknown name lists the valid ones."""
    defn = stage_def(stage)
    if stage not in STAGE_TASKS:
        STAGE_TASKS[stage] = make_stage_task(defn)
    return STAGE_TASKS[stage]


def run_stage(
    runner: StageRunner, stage: str, pipeline: ResolvedPipeline, run_id: str,
    done: Mapping[str, Any],
) -> Any:
    """Run ``stage`` through its Prefect task on the upstream results ``done`` (by role, as the
    stage table names them), fanning a per-scene stage out over the suite first."""
    defn = stage_def(stage)
    args: list[Any] = [done.get(role) for role in defn.inputs]
    if defn.per_scene:
        args.append(runner.each_scene(validate_scene_task, pipeline, run_id, *args))
    return runner(stage_task(stage), pipeline, run_id, *args)


@task(name="start-run")
def start_run(pipeline: ResolvedPipeline) -> str:
    """Open the parent MLflow run."""
    return start_pipeline(pipeline)


@task(name="resolve-expert")
def resolve_expert_task(pipeline: ResolvedPipeline, run_id: str) -> Policy | None:
    """Look up the registry or store policy that collect.expert names (never cached: an alias
    can move)."""
    ctx = stage_context(pipeline, run_id, current_progress())
    return resolve_expert(pipeline, ctx)


@task(
    name="validate-scene",
    task_run_name="validate-{scene_name}",
    cache_key_fn=lambda _, p: scene_key(p["pipeline"], p["policy"], p["index"]),
    persist_result=True,
    result_serializer="json",
    retries=2,
    retry_delay_seconds=[2, 10],
    retry_condition_fn=_transient,
)
def validate_scene_task(
    pipeline: ResolvedPipeline, run_id: str, policy: Policy, index: int, scene_name: str
) -> SceneResult:
    """Roll the policy out in one scene of the suite."""
    ctx = stage_context(pipeline, run_id, current_progress())
    return validate.validate_scene(pipeline.config.validate_, policy, index, ctx, pipeline.suite)


def _show(pipeline: ResolvedPipeline, ctx: StageContext, result: object) -> None:
    """Attach to the flow run what it shows of a stage's result: a sim report's table of
    scenes and gates, and the link to its evaluation report."""
    if not isinstance(result, SimReport):
        return
    report = result
    create_table_artifact(
        [_scene_row(s, g) for s, g in zip(report.scenes, report.gates[:len(report.scenes)],
                                          strict=True)],
        key=f"{_artifact_key(pipeline)}-sim-report",
        description=f"suite {report.suite} ({report.suite_digest[:12]}), "
        f"{report.backend} {report.backend_version}",
    )
    if report.mlflow_run_id is not None:
        page = f"{ctx.lineage.run_url(report.mlflow_run_id)}/artifactPath/{REPORT_HTML}"
        create_link_artifact(page, link_text="evaluation report",
                             key=f"{_artifact_key(pipeline)}-evaluation-report",
                             description="the validation run's evaluation report (HTML)")


def _scene_row(s: SceneResult, g: GateResult) -> dict[str, object]:
    return {
        "scene": s.scene,
        "episodes": s.episodes,
        "success": round(s.success_rate, 4),
        "ci95_low": round(s.ci_low, 4),
        "ci95_high": round(s.ci_high, 4),
        "mean_return": round(s.mean_return, 3),
        "gate": f"{'pass' if g.passed else 'FAIL'} (low >= {g.threshold:.2f})",
        "critic": "" if s.critic is None else ("pass" if s.critic.passed else "FAIL"),
    }


def _artifact_key(pipeline: ResolvedPipeline) -> str:
    return "".join(c if c.isalnum() else "-" for c in pipeline.config.name.lower())


@task(name="finish-run")
def finish_run(
    pipeline: ResolvedPipeline, run_id: str, outputs: Mapping[str, Any],
    cached: tuple[str, ...],
) -> PipelineResult:
    """End the MLflow run and attach the summary and the MLflow link to the flow run;
    ``outputs`` holds each stage's result by its role."""
    ctx = stage_context(pipeline, run_id, current_progress())
    url = finish_pipeline(ctx, outputs, cached)
    result = PipelineResult(run_id, url, dict(outputs), cached)
    key = _artifact_key(pipeline)
    create_markdown_artifact(summary_markdown(result), key=f"{key}-summary",
                             description="pipeline summary")
    create_link_artifact(url, link_text="MLflow run", key=f"{key}-mlflow-run")
    return result


class StageRunner:
    """Runs stage tasks in order and remembers which ones were cache hits.

    A cache hit whose artifact is no longer in the store (a wiped or switched store) is not
    trusted: the stage runs again.
    """

    def __init__(self, refresh: bool) -> None:
        self.refresh = refresh
        self.cached: list[str] = []
        self.store = open_services()[1]

    def _run(self, stage: Task[..., R], refresh: bool, args: tuple[Any, ...]) -> State[R]:
        """Run ``stage`` here, or on the flow's task runner when that places it on a node of
        its computer (a Ray cluster whose nodes advertise computers)."""
        task = stage.with_options(refresh_cache=refresh)
        context = FlowRunContext.get()
        places = getattr(context.task_runner if context else None, "places", None)
        if places is not None and places(stage.name):
            future = task.submit(*args)
            future.wait()
            return future.state
        state: State[R] = task(*args, return_state=True)  # type: ignore[assignment]
        return state

    def __call__(self, stage: Task[..., R], *args: Any) -> R:
        """Run ``stage`` on ``args``; returns its result, cached or fresh."""
        state = self._run(stage, self.refresh, args)
        if state.name != "Cached":
            fresh = state.result()
            crash_point(f"stage.{stage.name}.completed")
            return fresh
        result = state.result()
        if self._lost(stage, result):
            return self._run(stage, True, args).result()
        self.cached.append(stage.name)
        crash_point(f"stage.{stage.name}.cached")
        return result

    def _lost(self, stage: Task[..., Any], result: object) -> bool:
        """True when a cached result points at an artifact the store no longer holds."""
        if isinstance(result, ArtifactBase):
            digests: tuple[str | None, ...] = (result.digest,)
        elif isinstance(result, SceneResult):
            digests = (result.video_digest, result.usd_digest, result.episodes_digest)
        else:
            return False
        missing = [d for d in digests if d is not None and not self.store.has(d)]
        if not missing:
            return False
        log.warning("cached %s result %s is missing from the store; running %s again",
                    stage.name, missing[0][:12], stage.name)
        return True

    def each_scene(
        self, stage: Task[..., R], pipeline: ResolvedPipeline, run_id: str, policy: Policy
    ) -> tuple[R, ...]:
        """Run ``stage`` once per suite scene, in parallel on the flow's task runner."""
        suite = pipeline.suite

        def submit(i: int, refresh: bool) -> Any:
            backend, entry = suite.run(i)
            name = entry.scene.config.name
            if backend != suite.config.backend:
                name = f"{name}-{backend}"
            if suite.sweep_point(i) is not None:
                name = f"{name}-sweep-{i - len(suite.scenes) * len(suite.backends)}"
            return stage.with_options(refresh_cache=refresh).submit(
                pipeline, run_id, policy, i, name
            )

        futures = [submit(i, self.refresh) for i in range(suite.runs)]
        results = [f.result() for f in futures]
        hits = 0
        for i, f in enumerate(futures):
            if f.state.name == "Cached" and not self._lost(stage, results[i]):
                hits += 1
                crash_point(f"stage.{stage.name}.cached.{i}")
                continue
            if f.state.name == "Cached":
                results[i] = submit(i, True).result()
            crash_point(f"stage.{stage.name}.completed.{i}")
        if hits == len(futures):
            self.cached.append(stage.name)
        return tuple(results)
