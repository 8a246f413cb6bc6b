"""What ``flows deploy`` makes the Prefect server hold, planned without contacting it: one work
pool per computer (process, or Kubernetes from ``configs/k8s/<computer>.yaml``), a pipeline
deployment and a nightly sim-regression deployment per config, a stage deployment per computer,
and for Kubernetes pools every stage's Job manifest."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.k8s_templates import check_job_manifest, load_job_template, render_job_manifest
from physai_core.errors import ConfigError, Problem
from stages.orchestration.stage_table import COMPUTERS, stages_on

if TYPE_CHECKING:
    from prefect.client.schemas.responses import DeploymentResponse

    from stages.pipeline.config import ResolvedPipeline


NO_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
"""The parameter schema the server keeps for a deployment created without one."""


PIPELINE_ENTRYPOINT = "flows/pipeline.py:pipeline_flow"
"""The pipeline flow, deployed once per config."""


NIGHTLY_FLOW = "nightly-regression"
"""Name of the nightly sim-regression flow (its ``@flow(name=...)``)."""


NIGHTLY_ENTRYPOINT = "flows/nightly.py:nightly_regression"
"""The nightly regression flow, deployed once per config (the deployment is named after it)."""

ENGINE_FLOW = "engine-build"
"""Name of the on-target TensorRT engine build flow (:mod:`flows.engine`)."""

ENGINE_ENTRYPOINT = "flows/engine.py:engine_build_flow"
"""The engine build, deployed once on the ``jetson`` pool (deployment ``engine-build/jetson``):
a run with a bundle digest builds, checks and records that bundle's engine on the robot's
computer."""


NIGHTLY_CRON = "0 2 * * *"


NIGHTLY_TIMEZONE = "UTC"


@dataclass(frozen=True)
class PoolSpec:
    """A work pool to hold: its name, worker type and base job template."""

    name: str
    computer: str
    type: str
    base_job_template: dict[str, Any]
    template_file: Path | None = None
    """The Kubernetes template it came from; ``None`` for a process pool."""

    @property
    def description(self) -> str:
        """What the pool runs, shown in the Prefect UI."""
        stages = [s.name for s in stages_on(self.computer)]
        return f"physai {self.computer} computer: {', '.join(stages)}"


@dataclass(frozen=True)
class DeploymentSpec:
    """A deployment to hold, named ``flow_name/name`` on the server."""

    flow_name: str
    name: str
    entrypoint: str
    work_pool: str
    description: str
    parameters: dict[str, Any]
    job_variables: dict[str, Any]
    pull_steps: list[dict[str, Any]]
    parameter_schema: dict[str, Any]
    """OpenAPI schema of the flow's parameters; :data:`NO_SCHEMA` when the flow is not imported."""
    cron: str | None = None
    timezone: str | None = None
    concurrency_limit: int | None = None
    """Most runs at a time; a run scheduled while the limit is reached is cancelled."""

    @property
    def full_name(self) -> str:
        """``flow/deployment``, as Prefect names a deployment."""
        return f"{self.flow_name}/{self.name}"

    def state(self) -> dict[str, Any]:
        """What this spec asks the server to hold, in the form :func:`held_state` reads back."""
        return {
            "entrypoint": self.entrypoint,
            "work_pool": self.work_pool,
            "description": self.description,
            "parameters": self.parameters,
            "job_variables": self.job_variables,
            "pull_steps": self.pull_steps,
            "parameter_schema": self.parameter_schema,
            "enforce_parameter_schema": self.parameter_schema != NO_SCHEMA,
            "schedules": [(self.cron, self.timezone)] if self.cron else [],
            "concurrency_limit": self.concurrency_limit,
            "collision_strategy": "CANCEL_NEW" if self.concurrency_limit else None,
        }


@dataclass(frozen=True)
class StageJob:
    """The Kubernetes Job one stage of one config runs as in its computer's pool."""

    config: Path
    stage: str
    pool: str
    template_file: str
    manifest: dict[str, Any]


@dataclass(frozen=True)
class DeployPlan:
    """Everything ``flows deploy`` makes the server hold, and the Jobs the stages would run as."""

    pools: tuple[PoolSpec, ...]
    deployments: tuple[DeploymentSpec, ...]
    jobs: tuple[StageJob, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """What deploying did to one pool or deployment: created, updated, unchanged or planned."""

    kind: str
    name: str
    action: str
    id: str | None = None


def _process_template() -> dict[str, Any]:
    from prefect.workers.process import ProcessWorker

    return ProcessWorker.get_default_base_job_template()


def plan_pools(kubernetes: bool, templates: Path, docker: Sequence[str] | None = None,
               secrets: Sequence[str] = ()) -> tuple[PoolSpec, ...]:
    """One work pool per computer: process pools, Kubernetes pools from ``templates``, or with
    ``docker`` (the extra volumes, ``SRC:DST[:ro]``) Docker pools (:mod:`flows.docker_pools`),
    whose containers get ``secrets`` (``VAR=BLOCK``) from Prefect Secret blocks."""
    from flows.workpools import work_pool

    pools: dict[str, PoolSpec] = {}
    for computer in COMPUTERS:
        name = work_pool(computer)
        if kubernetes:
            path = templates / f"{computer}.yaml"
            spec = PoolSpec(name, computer, "kubernetes", load_job_template(path), path)
        elif docker is not None:
            from flows.docker_pools import docker_template

            spec = PoolSpec(name, computer, "docker",
                            docker_template(computer, docker, secrets=secrets))
        else:
            spec = PoolSpec(name, computer, "process", _process_template())
        other = pools.get(name)
        if other is not None and other.base_job_template != spec.base_job_template:
            raise ConfigError.one(
                f"PHYSAI_POOL_{computer.upper()}", "", name,
                f"names the pool of {other.computer} too, whose job template differs")
        pools.setdefault(name, spec)
    return tuple(pools.values())


def _fitting(values: Mapping[str, Any], pool: PoolSpec) -> dict[str, Any]:
    """The job variables among ``values`` that ``pool``'s template declares."""
    declared = pool.base_job_template["variables"].get("properties", {})
    return {k: v for k, v in values.items() if k in declared}


def _config_parameter(config: Path, project_dir: Path) -> str:
    """How a flow run started in ``project_dir`` names ``config``: relative to it. Where
    ``project_dir`` is not a folder here (the project's folder in an image), a config inside
    the current folder is named relative to that, the image holding this checkout.

    Raises:
        ValueError: ``config`` lies outside the project folder, where a deployment would
            refuse to read it.
    """
    resolved = config.resolve()
    if resolved.is_relative_to(project_dir):
        return str(resolved.relative_to(project_dir))
    here = Path.cwd().resolve()
    if not project_dir.is_dir() and resolved.is_relative_to(here):
        return str(resolved.relative_to(here))
    raise ValueError(f"outside the project folder {project_dir} (--project-dir) the "
                     "deployments run in; a deployment runs only configs inside it")


def plan_deployments(
    configs: Sequence[Path], *, kubernetes: bool = False, templates: Path = Path("configs/k8s"),
    project_dir: Path, nightly_cron: str = NIGHTLY_CRON, timezone: str = NIGHTLY_TIMEZONE,
    dispatch: bool = True, docker: Sequence[str] | None = None, secrets: Sequence[str] = (),
) -> DeployPlan:
    """Plan the pools, a pipeline deployment per config, the nightly regression and (with
    ``kubernetes``) the checked Job manifest of every stage; every problem found is raised at
    once as a :class:`ConfigError`.

    Flow runs start in ``project_dir`` (the checkout here, or the project's folder in the
    image), where the config paths given to the pipeline flow are relative to; a config
    outside it is refused, as a run of the deployment would refuse it. A pipeline
    deployment runs in its train stage's pool with that stage's job variables less ``command``
    and ``nodes``: its flow run is one process or pod, which starts torchrun itself when the
    stage asks for several processes. With ``docker`` (extra volumes, possibly none) the pools
    are Docker pools running each flow run in its computer's image, with ``secrets``
    (``VAR=BLOCK``) from Prefect Secret blocks.

    With ``dispatch`` (the default) every stage runs on its own computer's pool instead: the
    stage flow is deployed once per computer (``stage/<computer>``) and the pipeline
    deployment, now only an orchestrator, runs on the ``ovx`` pool without job variables.
    """
    from stages.pipeline.config import load_pipeline

    problems = _schedule_problems(nightly_cron, timezone)
    project_dir = project_dir.resolve()
    pools = plan_pools(kubernetes, templates, docker, secrets)
    by_name = {p.name: p for p in pools}
    pull_steps = [{"prefect.deployments.steps.set_working_directory":
                   {"directory": str(project_dir)}}]
    deployments: list[DeploymentSpec] = []
    jobs: list[StageJob] = []
    for config in configs:
        try:
            config_path = _config_parameter(config, project_dir)
        except ValueError as exc:
            problems.append(Problem(str(config), "", str(config), str(exc)))
            continue
        try:
            pipeline = load_pipeline(config)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        twin = next((d for d in deployments if d.name == config.stem), None)
        if twin is not None:
            problems.append(Problem(str(config), "", config.stem,
                                    f"deployment {twin.full_name} already deploys "
                                    f"{twin.parameters['config_path']}; rename one file"))
            continue
        deployments += _config_deployments(pipeline, config.stem, config_path, by_name,
                                           pull_steps, dispatch, nightly_cron, timezone)
        if kubernetes:
            for stage in pipeline.stages:
                job, found = _stage_job(pipeline, config, stage, by_name)
                problems.extend(found)
                jobs.append(job)
    deployments += _shared_deployments(pull_steps, dispatch=dispatch, engine=bool(configs))
    if problems:
        raise ConfigError({str(p): p for p in problems}.values())
    return DeployPlan(pools, tuple(deployments), tuple(jobs))


def _schedule_problems(nightly_cron: str, timezone: str) -> list[Problem]:
    """What is wrong with the nightly schedule's cron and time zone, as Prefect checks them."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    problems: list[Problem] = []
    try:
        CronSchedule(cron=nightly_cron, timezone=timezone)
    except ValidationError as exc:
        for error in exc.errors():
            flag, value = (("--timezone", timezone) if error["loc"] == ("timezone",)
                           else ("--nightly-cron", nightly_cron))
            problems.append(Problem("flows deploy", flag, value,
                                    error["msg"].removeprefix("Value error, ")))
    return problems


def _config_deployments(
    pipeline: ResolvedPipeline, name: str, config_path: str, by_name: dict[str, PoolSpec],
    pull_steps: list[dict[str, Any]], dispatch: bool, nightly_cron: str, timezone: str,
) -> list[DeploymentSpec]:
    """One config's pipeline deployment and its nightly regression."""
    from flows.nightly import nightly_regression
    from flows.pipeline import pipeline_flow
    from flows.workpools import job_variables, work_pool

    train = job_variables(pipeline, "train")
    pool = by_name[work_pool("ovx")] if dispatch else by_name[train["work_pool"]]
    run_variables = {} if dispatch else {
        k: v for k, v in train["job_variables"].items() if k not in ("command", "nodes")}
    parameters: dict[str, Any] = {"config_path": config_path}
    if dispatch:
        parameters["dispatch"] = True
    return [
        DeploymentSpec(
            flow_name=pipeline_flow.name, name=name, entrypoint=PIPELINE_ENTRYPOINT,
            work_pool=pool.name,
            description=f"{pipeline.config.name}: {' -> '.join(pipeline.stages)}",
            parameters=parameters,
            job_variables=_fitting(run_variables, pool), pull_steps=pull_steps,
            parameter_schema=pipeline_flow.parameters.model_dump_for_openapi(),
        ),
        DeploymentSpec(
            flow_name=NIGHTLY_FLOW, name=name, entrypoint=NIGHTLY_ENTRYPOINT,
            work_pool=work_pool("ovx"),
            description=f"nightly sim regression of models:/"
                        f"{pipeline.config.promote.model_name}@champion",
            parameters={"config_path": config_path},
            job_variables={}, pull_steps=pull_steps,
            parameter_schema=nightly_regression.parameters.model_dump_for_openapi(),
            cron=nightly_cron, timezone=timezone, concurrency_limit=1,
        ),
    ]


def _shared_deployments(pull_steps: list[dict[str, Any]], *, dispatch: bool,
                        engine: bool) -> list[DeploymentSpec]:
    """The deployments every config shares: the stage flow once per computer (with
    ``dispatch``) and the engine build on the target (when anything is deployed)."""
    from flows.dispatch import STAGE_ENTRYPOINT, STAGE_FLOW, stage_flow
    from flows.workpools import work_pool

    deployments: list[DeploymentSpec] = []
    if dispatch:
        stage_schema = stage_flow.parameters.model_dump_for_openapi()
        for computer in COMPUTERS:
            deployments.append(DeploymentSpec(
                flow_name=STAGE_FLOW, name=computer, entrypoint=STAGE_ENTRYPOINT,
                work_pool=work_pool(computer),
                description=f"one pipeline stage on the {computer} computer",
                parameters={}, job_variables={}, pull_steps=pull_steps,
                parameter_schema=stage_schema,
            ))
    if engine:
        from flows.engine import engine_build_flow

        deployments.append(DeploymentSpec(
            flow_name=ENGINE_FLOW, name="jetson", entrypoint=ENGINE_ENTRYPOINT,
            work_pool=work_pool("jetson"),
            description="build, check and time a bundle's TensorRT engine on the target, and "
                        "record the report in MLflow (needs TensorRT)",
            parameters={}, job_variables={}, pull_steps=pull_steps,
            parameter_schema=engine_build_flow.parameters.model_dump_for_openapi(),
        ))
    return deployments


def _stage_job(pipeline: ResolvedPipeline, config: Path, stage: str,
               pools: Mapping[str, PoolSpec]) -> tuple[StageJob, list[Problem]]:
    """Render and check the Job of one stage in its computer's Kubernetes pool."""
    import jsonschema

    from flows.workpools import job_variables, stage_resources
    from stages.sections.models import Resources

    target = job_variables(pipeline, stage)
    pool = pools[target["work_pool"]]
    file = str(pool.template_file)
    values = {**target["job_variables"], "name": _k8s_name(f"{config.stem}-{stage}")}
    schema = pool.base_job_template["variables"]
    problems = [
        Problem(file, "variables" + "".join(f".{p}" for p in e.absolute_path), e.instance,
                f"job variable of {config} {stage}: {e.message}")
        for e in jsonschema.Draft202012Validator(schema).iter_errors(values)
    ]
    if stage_resources(pipeline, stage) != Resources():
        declared = schema.get("properties", {})
        problems += [Problem(file, f"variables.properties.{k}", v,
                             f"{config} {stage} asks for it but the template does not declare it")
                     for k, v in target["job_variables"].items() if k not in declared]
    manifest = render_job_manifest(pool.base_job_template, values)
    problems += check_job_manifest(manifest, file)
    return StageJob(config, stage, pool.name, file, manifest), problems


def _k8s_name(text: str) -> str:
    """``text`` as a Kubernetes object name: lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:50] or "physai"


def held_state(deployment: DeploymentResponse) -> dict[str, Any]:
    """What the server holds for a deployment, comparable with :meth:`DeploymentSpec.state`."""
    from prefect.client.schemas.schedules import CronSchedule

    schedules = sorted(
        (s.schedule.cron, s.schedule.timezone) if isinstance(s.schedule, CronSchedule)
        else (repr(s.schedule), None)
        for s in deployment.schedules
    )
    limit = deployment.global_concurrency_limit
    options = deployment.concurrency_options
    return {
        "entrypoint": deployment.entrypoint,
        "work_pool": deployment.work_pool_name,
        "description": deployment.description,
        "parameters": deployment.parameters,
        "job_variables": deployment.job_variables,
        "pull_steps": deployment.pull_steps,
        "parameter_schema": deployment.parameter_openapi_schema,
        "enforce_parameter_schema": deployment.enforce_parameter_schema,
        "schedules": schedules,
        "concurrency_limit": limit.limit if limit is not None else None,
        "collision_strategy": options.collision_strategy.value if options else None,
    }
