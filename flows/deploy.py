"""Deployments and workers of the three computers: ``flows deploy`` and ``flows worker POOL``.

``flows deploy`` makes the Prefect server hold what the three computers need: one work pool per
computer (process pools, or with ``--kubernetes`` Kubernetes pools whose base job templates
live in ``configs/k8s/<computer>.yaml``), a deployment of the pipeline flow for every config in
``configs/``, and for each config the nightly sim regression of its model's ``@champion`` on a
cron schedule, one run at a time. It reads
what the server holds first and writes only what differs, so deploying twice changes nothing.
``--dry-run`` contacts no server: it prints the plan and, for Kubernetes pools, the Job
manifest of every stage of every config, each checked against the Kubernetes API models.

``flows worker POOL`` starts a Prefect worker that polls one of the three pools.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import functools
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stages.errors import (
    BackendUnavailableError,
    ConfigError,
    PhysaiError,
    Problem,
    UnknownNameError,
)
from stages.stage_table import COMPUTERS, stages_on

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.responses import DeploymentResponse
    from rich.console import Console
    from rich.table import Table

    from stages.config import ResolvedPipeline

PIPELINE_ENTRYPOINT = "flows/pipeline.py:pipeline_flow"
"""The pipeline flow, deployed once per config."""

NIGHTLY_FLOW = "nightly-regression"
"""Name of the nightly sim-regression flow (its ``@flow(name=...)``)."""

NIGHTLY_ENTRYPOINT = "flows/nightly.py:nightly_regression"
"""The nightly regression flow, deployed once per config (the deployment is named after it)."""

NO_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
"""The parameter schema the server keeps for a deployment created without one."""

NIGHTLY_CRON = "0 2 * * *"
NIGHTLY_TIMEZONE = "UTC"

FLOW_RUN_COMMAND = "prefect flow-run execute"
"""What a Kubernetes worker's pod runs when the job variables give no ``command``."""

WORKER_POD_SPEC = {"parallelism": 1, "completions": 1, "restartPolicy": "Never"}
"""Pod-spec values Prefect's Kubernetes worker insists on before it submits a Job. Kubernetes
ignores the first two in a pod spec (a Job's own ``parallelism`` sits in the Job spec)."""

WORKER_CONTAINER = "prefect-job"
"""Name the Kubernetes worker requires of the first container."""

QUANTITY = re.compile(
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$")
"""A Kubernetes resource quantity: ``8``, ``500m``, ``512Gi``, ``1.5``."""

QUANTITY_MAPS = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests")}
"""Model fields typed ``dict[str, str]`` whose values are quantities, which may be numbers."""

_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
    "datetime": (str,), "date": (str,),
}


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


def load_job_template(path: Path) -> dict[str, Any]:
    """Read a Kubernetes base job template and check it the way the Prefect server does: a
    ``job_configuration`` with a ``job_manifest``, a ``variables`` schema declaring every
    placeholder."""
    from prefect.utilities.templating import find_placeholders

    from stages.schema import read_yaml

    template = read_yaml(path)
    if not isinstance(template, dict):
        raise ConfigError.one(path, "", type(template).__name__, "must be a mapping")
    problems: list[Problem] = []
    config = template.get("job_configuration")
    variables = template.get("variables")
    properties = variables.get("properties") if isinstance(variables, dict) else None
    if not isinstance(config, dict) or not isinstance(config.get("job_manifest"), dict):
        problems.append(Problem(str(path), "job_configuration.job_manifest", None,
                                "missing: a base job template needs a Job manifest"))
    if not isinstance(properties, dict):
        problems.append(Problem(str(path), "variables.properties", None,
                                "missing: a base job template declares its variables"))
    if problems or not (isinstance(config, dict) and isinstance(properties, dict)):
        raise ConfigError(problems)
    used = {p.name for p in find_placeholders(config)}
    problems = [Problem(str(path), "variables.properties", name, "placeholder not declared")
                for name in sorted(used - set(properties))]
    if problems:
        raise ConfigError(problems)
    return template


def render_job_manifest(template: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The Job manifest Prefect's Kubernetes worker submits for a flow run with job variables
    ``values``: the template's defaults overlaid by ``values``, placeholders filled (a
    placeholder without a value drops its key), ``env`` as name/value pairs of the first
    container and ``command`` split into its ``args``, or the flow-run command when unset."""
    from prefect.utilities.templating import apply_values

    properties = template["variables"].get("properties", {})
    variables = {k: v["default"] for k, v in properties.items() if v.get("default") is not None}
    variables.update(values)
    config = apply_values(copy.deepcopy(template["job_configuration"]), variables)
    manifest: dict[str, Any] = config["job_manifest"]
    containers = manifest.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
    if isinstance(containers, list) and containers and isinstance(containers[0], dict):
        first = containers[0]
        env = [{"name": k, "value": str(v)} for k, v in (config.get("env") or {}).items()]
        first["env"] = env + first["env"] if isinstance(first.get("env"), list) else env
        args = first.get("args")
        if args is None or isinstance(args, str):
            first["args"] = shlex.split(args or FLOW_RUN_COMMAND)
    return manifest


def check_job_manifest(manifest: Mapping[str, Any], file: str | Path) -> list[Problem]:
    """Problems that keep ``manifest`` from being a Job that Prefect's Kubernetes worker submits
    and the Kubernetes API accepts: fields unknown to the API models, missing required fields,
    values of the wrong type, resource amounts that are not quantities. Each names ``file``
    (the template), the field's path in the manifest and its value."""
    try:
        from kubernetes import client as k8s
    except ImportError as exc:
        raise BackendUnavailableError("kubernetes", "kubernetes", exc) from None

    problems: list[Problem] = []

    def bad(path: str, value: object, message: str) -> None:
        problems.append(Problem(str(file), path, value, message))

    for key, want in (("apiVersion", "batch/v1"), ("kind", "Job")):
        if manifest.get(key) != want:
            bad(key, manifest.get(key), f"must be {want!r}")
    job = copy.deepcopy(dict(manifest))
    pod = job.get("spec", {}).get("template", {}).get("spec")
    if isinstance(pod, dict):
        for name, needed in WORKER_POD_SPEC.items():
            if pod.get(name) != needed:
                bad(f"spec.template.spec.{name}", pod.get(name),
                    f"Prefect's Kubernetes worker needs {needed!r}")
        pod.pop("parallelism", None)
        pod.pop("completions", None)
        containers = pod.get("containers")
        first = containers[0] if isinstance(containers, list) and containers else None
        if isinstance(first, dict) and first.get("name") != WORKER_CONTAINER:
            bad("spec.template.spec.containers[0].name", first.get("name"),
                f"Prefect's Kubernetes worker needs {WORKER_CONTAINER!r}")
    _check_value(job, "V1Job", "", k8s, bad)
    return problems


def _check_value(value: object, kind: str, path: str, k8s: Any,
                 bad: Callable[[str, object, str], None]) -> None:
    """Check ``value`` against the Kubernetes client's type name ``kind`` (a model, a primitive,
    ``list[...]`` or ``dict[str, ...]``)."""
    if kind.startswith("list["):
        if not isinstance(value, list):
            bad(path, value, "must be a list")
            return
        for i, item in enumerate(value):
            _check_value(item, kind[5:-1], f"{path}[{i}]", k8s, bad)
    elif kind.startswith("dict["):
        if not isinstance(value, dict):
            bad(path, value, "must be a mapping")
            return
        inner = kind[kind.index(",") + 1:-1].strip()
        for key, item in value.items():
            _check_value(item, inner, f"{path}[{key}]", k8s, bad)
    elif kind in _PRIMITIVES:
        types = _PRIMITIVES[kind]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            bad(path, value, f"must be of type {kind}")
    elif kind != "object":
        _check_model(value, kind, path, k8s, bad)


def _check_model(value: object, kind: str, path: str, k8s: Any,
                 bad: Callable[[str, object, str], None]) -> None:
    model = getattr(k8s, kind)
    if not isinstance(value, dict):
        bad(path, value, f"must be a mapping ({kind})")
        return
    attrs = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key not in attrs:
            close = difflib.get_close_matches(key, attrs, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            bad(where, item, f"unknown field of {kind}{hint}")
        elif item is not None and (kind, key) in QUANTITY_MAPS:
            _check_quantities(item, where, bad)
        elif item is not None:
            _check_value(item, model.openapi_types[attrs[key]], where, k8s, bad)
    for key in sorted(_required_fields(model)):
        if value.get(key) is None:
            bad(f"{path}.{key}" if path else key, None, f"required field of {kind} is missing")


def _check_quantities(value: object, path: str, bad: Callable[[str, object, str], None]) -> None:
    if not isinstance(value, dict):
        bad(path, value, "must be a mapping of resource name to quantity")
        return
    for name, amount in value.items():
        ok = isinstance(amount, int | float | str) and not isinstance(amount, bool)
        if not ok or not QUANTITY.match(str(amount)):
            bad(f"{path}[{name}]", amount, "not a Kubernetes quantity (e.g. 8, 500m, 512Gi)")


@functools.cache
def _required_fields(model: Any) -> frozenset[str]:
    """JSON names of the fields a Kubernetes client model refuses to leave unset."""
    from kubernetes.client import Configuration

    config = Configuration()
    config.client_side_validation = True
    probe = model.__new__(model)
    probe.local_vars_configuration = config
    required = set()
    for attr, json_key in model.attribute_map.items():
        try:
            setattr(probe, attr, None)
        except ValueError:
            required.add(json_key)
    return frozenset(required)


def _process_template() -> dict[str, Any]:
    from prefect.workers.process import ProcessWorker

    return ProcessWorker.get_default_base_job_template()


def plan_pools(kubernetes: bool, templates: Path) -> tuple[PoolSpec, ...]:
    """One work pool per computer: process pools, or Kubernetes pools from ``templates``."""
    from flows.workpools import work_pool

    pools: dict[str, PoolSpec] = {}
    for computer in COMPUTERS:
        name = work_pool(computer)
        if kubernetes:
            path = templates / f"{computer}.yaml"
            spec = PoolSpec(name, computer, "kubernetes", load_job_template(path), path)
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
    """How a flow run started in ``project_dir`` names ``config``."""
    resolved = config.resolve()
    if resolved.is_relative_to(project_dir):
        return str(resolved.relative_to(project_dir))
    return str(resolved)


def plan_deployments(
    configs: Sequence[Path], *, kubernetes: bool = False, templates: Path = Path("configs/k8s"),
    project_dir: Path, nightly_cron: str = NIGHTLY_CRON, timezone: str = NIGHTLY_TIMEZONE,
    dispatch: bool = True,
) -> DeployPlan:
    """Plan the pools, a pipeline deployment per config, the nightly regression and (with
    ``kubernetes``) the checked Job manifest of every stage; every problem found is raised at
    once as a :class:`ConfigError`.

    Flow runs start in ``project_dir`` (the checkout here, or the project's folder in the
    image), where the config paths given to the pipeline flow are relative to. A pipeline
    deployment runs in its train stage's pool with that stage's job variables less ``command``
    and ``nodes``: its flow run is one process or pod, which starts torchrun itself when the
    stage asks for several processes.

    With ``dispatch`` (the default) every stage runs on its own computer's pool instead: the
    stage flow is deployed once per computer (``stage/<computer>``) and the pipeline
    deployment, now only an orchestrator, runs on the ``ovx`` pool without job variables.
    """
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    from flows.dispatch import STAGE_ENTRYPOINT, STAGE_FLOW, stage_flow
    from flows.nightly import nightly_regression
    from flows.pipeline import pipeline_flow
    from flows.workpools import job_variables, work_pool
    from stages.config import load_pipeline

    problems: list[Problem] = []
    try:
        CronSchedule(cron=nightly_cron, timezone=timezone)
    except ValidationError as exc:
        for error in exc.errors():
            flag, value = (("--timezone", timezone) if error["loc"] == ("timezone",)
                           else ("--nightly-cron", nightly_cron))
            problems.append(Problem("flows deploy", flag, value,
                                    error["msg"].removeprefix("Value error, ")))
    project_dir = project_dir.resolve()
    pools = plan_pools(kubernetes, templates)
    by_name = {p.name: p for p in pools}
    pull_steps = [{"prefect.deployments.steps.set_working_directory":
                   {"directory": str(project_dir)}}]
    schema = pipeline_flow.parameters.model_dump_for_openapi()
    nightly_schema = nightly_regression.parameters.model_dump_for_openapi()
    deployments: list[DeploymentSpec] = []
    jobs: list[StageJob] = []
    for config in configs:
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
        train = job_variables(pipeline, "train")
        pool = by_name[work_pool("ovx")] if dispatch else by_name[train["work_pool"]]
        run_variables = {} if dispatch else {
            k: v for k, v in train["job_variables"].items() if k not in ("command", "nodes")}
        parameters: dict[str, Any] = {"config_path": _config_parameter(config, project_dir)}
        if dispatch:
            parameters["dispatch"] = True
        deployments.append(DeploymentSpec(
            flow_name=pipeline_flow.name, name=config.stem, entrypoint=PIPELINE_ENTRYPOINT,
            work_pool=pool.name,
            description=f"{pipeline.config.name}: {' -> '.join(pipeline.stages)}",
            parameters=parameters,
            job_variables=_fitting(run_variables, pool), pull_steps=pull_steps,
            parameter_schema=schema,
        ))
        deployments.append(DeploymentSpec(
            flow_name=NIGHTLY_FLOW, name=config.stem, entrypoint=NIGHTLY_ENTRYPOINT,
            work_pool=work_pool("ovx"),
            description=f"nightly sim regression of models:/"
                        f"{pipeline.config.promote.model_name}@champion",
            parameters={"config_path": _config_parameter(config, project_dir)},
            job_variables={}, pull_steps=pull_steps, parameter_schema=nightly_schema,
            cron=nightly_cron, timezone=timezone, concurrency_limit=1,
        ))
        if kubernetes:
            for stage in pipeline.stages:
                job, found = _stage_job(pipeline, config, stage, by_name)
                problems.extend(found)
                jobs.append(job)
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
    if problems:
        raise ConfigError({str(p): p for p in problems}.values())
    return DeployPlan(pools, tuple(deployments), tuple(jobs))


def _stage_job(pipeline: ResolvedPipeline, config: Path, stage: str,
               pools: Mapping[str, PoolSpec]) -> tuple[StageJob, list[Problem]]:
    """Render and check the Job of one stage in its computer's Kubernetes pool."""
    import jsonschema

    from flows.workpools import job_variables, stage_resources
    from stages.config import Resources

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


def apply_plan(plan: DeployPlan, client: SyncPrefectClient) -> list[Outcome]:
    """Create what the server lacks and update what differs from ``plan``; leave the rest.

    A pool that exists with another worker type stops everything before anything is written:
    Prefect cannot change a pool's type.
    """
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    held = {}
    for pool in plan.pools:
        try:
            held[pool.name] = client.read_work_pool(pool.name)
        except ObjectNotFound:
            continue
        if held[pool.name].type != pool.type:
            raise PhysaiError(
                f"work pool {pool.name!r} exists with type {held[pool.name].type!r}, not "
                f"{pool.type!r}; delete it first (prefect work-pool delete {pool.name}) or "
                f"deploy {'with' if held[pool.name].type == 'kubernetes' else 'without'} "
                "--kubernetes")
    outcomes = []
    for pool in plan.pools:
        existing = held.get(pool.name)
        if existing is None:
            created = client.create_work_pool(WorkPoolCreate(
                name=pool.name, type=pool.type, base_job_template=pool.base_job_template,
                description=pool.description))
            outcomes.append(Outcome("work pool", pool.name, "created", str(created.id)))
        elif (existing.base_job_template, existing.description) != (
                pool.base_job_template, pool.description):
            client.update_work_pool(pool.name, WorkPoolUpdate(
                base_job_template=pool.base_job_template, description=pool.description))
            outcomes.append(Outcome("work pool", pool.name, "updated", str(existing.id)))
        else:
            outcomes.append(Outcome("work pool", pool.name, "unchanged", str(existing.id)))
    outcomes += [_apply_deployment(spec, client) for spec in plan.deployments]
    return outcomes


def _apply_deployment(spec: DeploymentSpec, client: SyncPrefectClient) -> Outcome:
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy, ConcurrencyOptions
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.exceptions import ObjectNotFound

    try:
        existing = client.read_deployment_by_name(spec.full_name)
    except ObjectNotFound:
        existing = None
    if existing is not None and held_state(existing) == spec.state():
        return Outcome("deployment", spec.full_name, "unchanged", str(existing.id))
    schedules = [DeploymentScheduleCreate(
        schedule=CronSchedule(cron=spec.cron, timezone=spec.timezone), active=True,
        slug=spec.name)] if spec.cron else []
    options = (ConcurrencyOptions(collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)
               if spec.concurrency_limit else None)
    deployment_id = client.create_deployment(
        flow_id=existing.flow_id if existing else client.create_flow_from_name(spec.flow_name),
        name=spec.name, entrypoint=spec.entrypoint, work_pool_name=spec.work_pool,
        description=spec.description, parameters=spec.parameters,
        job_variables=spec.job_variables, pull_steps=spec.pull_steps,
        parameter_openapi_schema=spec.parameter_schema,
        enforce_parameter_schema=spec.parameter_schema != NO_SCHEMA,
        schedules=schedules, concurrency_limit=spec.concurrency_limit,
        concurrency_options=options,
    )
    return Outcome("deployment", spec.full_name, "updated" if existing else "created",
                   str(deployment_id))


def _prefect_api_url() -> str:
    """The Prefect API that deployments and workers use; a temporary server would not do."""
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        raise PhysaiError("no Prefect server: start one with `flows server up`, or set "
                          "PREFECT_API_URL (flows deploy --dry-run needs none)")
    return url


def _plan_table(plan: DeployPlan, outcomes: Iterable[Outcome], title: str) -> Table:
    """One row per pool and deployment: where it runs, what it holds, what deploying did."""
    from rich.table import Table

    action = {(o.kind, o.name): o.action for o in outcomes}
    table = Table(title=title, title_justify="left")
    for column in ("kind", "name", "work pool", "what", "status"):
        table.add_column(column)
    for pool in plan.pools:
        what = (f"kubernetes ({pool.template_file})" if pool.template_file
                else f"{pool.type} worker")
        table.add_row("work pool", pool.name, pool.name, what,
                      action.get(("work pool", pool.name), ""))
    for d in plan.deployments:
        if d.cron:
            what = (f"{d.entrypoint}, cron {d.cron!r} {d.timezone}, "
                    f"{d.concurrency_limit} at a time (cancel new)")
        else:
            what = f"{d.entrypoint}, config_path={d.parameters.get('config_path')}"
        table.add_row("deployment", d.full_name, d.work_pool, what,
                      action.get(("deployment", d.full_name), ""))
    return table


def _print_jobs(console: Console, plan: DeployPlan) -> None:
    """The rendered Job manifests, as one YAML stream."""
    import yaml

    for job in plan.jobs:
        header = f"# {job.config} {job.stage} -> work pool {job.pool} ({job.template_file})"
        body = yaml.safe_dump(job.manifest, sort_keys=False)
        console.print(f"---\n{header}\n{body}", end="", soft_wrap=True, highlight=False,
                      markup=False)


def cmd_deploy(args: argparse.Namespace, console: Console) -> int:
    """Create or update the work pools and deployments, or print the plan (``--dry-run``)."""
    from flows.servers import prepare_environment

    prepare_environment()
    configs = [Path(c) for c in args.configs] or sorted(Path("configs").glob("*.yaml"))
    if not configs:
        raise ConfigError.one("configs", "", "configs/*.yaml", "no pipeline configs to deploy")
    plan = plan_deployments(
        configs, kubernetes=args.kubernetes, templates=Path(args.templates),
        project_dir=Path(args.project_dir).resolve(), nightly_cron=args.nightly_cron,
        timezone=args.timezone, dispatch=not args.no_dispatch,
    )
    if args.dry_run:
        planned = [Outcome("work pool", p.name, "planned") for p in plan.pools]
        planned += [Outcome("deployment", d.full_name, "planned") for d in plan.deployments]
        console.print(_plan_table(plan, planned, "flows deploy --dry-run (no server contacted)"))
        if plan.jobs:
            console.print(f"{len(plan.jobs)} stage Jobs, each checked against the Kubernetes "
                          "API models:", highlight=False)
            _print_jobs(console, plan)
        else:
            console.print("process pools: no Job manifests (--kubernetes renders and checks "
                          f"them from {args.templates}/)", highlight=False, markup=False)
        return 0
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = _prefect_api_url()
    with temporary_settings({PREFECT_API_URL: url}), get_client(sync_client=True) as client:
        error = client.api_healthcheck()
        if error is not None:
            raise PhysaiError(f"the Prefect API at {url} does not answer: {error}")
        outcomes = apply_plan(plan, client)
    console.print(_plan_table(plan, outcomes, f"flows deploy -> {url}"))
    pools = " | ".join(p.name for p in plan.pools)
    console.print(f"start a worker per pool: flows worker {pools}", highlight=False)
    return 0


def worker_command(pool: str, worker_type: str | None = None, name: str | None = None,
                   limit: int | None = None, run_once: bool = False) -> list[str]:
    """The ``prefect worker start`` command line for ``pool`` (without a type, Prefect uses the
    pool's own, or a process worker when the pool does not exist yet)."""
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool]
    if worker_type:
        cmd += ["--type", worker_type]
    if name:
        cmd += ["--name", name]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    if run_once:
        cmd.append("--run-once")
    return cmd


def cmd_worker(args: argparse.Namespace, console: Console) -> int:
    """Start a Prefect worker for one of the three pools; returns when the worker exits."""
    from flows.workpools import work_pool

    pools = {work_pool(c): c for c in COMPUTERS}
    if args.pool not in pools:
        raise UnknownNameError("work pool", args.pool, pools)
    from flows.servers import prepare_environment

    prepare_environment()
    url = _prefect_api_url()
    cmd = worker_command(args.pool, args.type, args.name, args.limit, args.run_once)
    console.print(f"worker for {pools[args.pool]}'s pool {args.pool!r} at {url}; "
                  "stop it with Ctrl-C", highlight=False, markup=False)
    return supervise(subprocess.Popen(cmd, env=dict(os.environ)))


STOP_GRACE_S = 30.0
"""Seconds a child has to exit after a forwarded SIGTERM or SIGINT before it is killed."""


def supervise(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc``, passing SIGTERM and SIGINT on to it, so a supervisor (systemd,
    Kubernetes, Ctrl-C) that stops this process stops the child too; a child still running
    :data:`STOP_GRACE_S` after the signal is killed. Returns the child's exit status (128 + N
    for a child ended by signal N, as a shell reports it)."""
    stopping: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)
            stopping.append(time.monotonic())

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                return 128 - code if code < 0 else code
            except subprocess.TimeoutExpired:
                if stopping and time.monotonic() - stopping[0] > STOP_GRACE_S:
                    proc.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``flows deploy`` and ``flows worker`` to the ``flows`` command line."""
    deploy = sub.add_parser("deploy", help="create the work pools and deployments on the "
                            "Prefect server (idempotent)")
    deploy.add_argument("configs", nargs="*",
                        help="pipeline configs to deploy (default: configs/*.yaml)")
    deploy.add_argument("--kubernetes", action="store_true",
                        help="Kubernetes work pools from the templates, not process pools")
    deploy.add_argument("--templates", default="configs/k8s",
                        help="folder of the Kubernetes base job templates, <computer>.yaml")
    deploy.add_argument("--project-dir", default=".",
                        help="where flow runs start: this checkout, or the project's folder "
                             "in the image (default: the current directory)")
    deploy.add_argument("--nightly-cron", default=NIGHTLY_CRON,
                        help=f"schedule of the nightly regression (default: {NIGHTLY_CRON!r})")
    deploy.add_argument("--timezone", default=NIGHTLY_TIMEZONE,
                        help=f"time zone of the schedule (default: {NIGHTLY_TIMEZONE})")
    deploy.add_argument("--no-dispatch", action="store_true",
                        help="run each pipeline whole on the dgx pool instead of each stage "
                             "on its own computer's pool")
    deploy.add_argument("--dry-run", action="store_true",
                        help="print the plan and the Job manifests; contact no server")
    deploy.set_defaults(func=cmd_deploy)
    worker = sub.add_parser("worker", help="start a Prefect worker for a work pool")
    worker.add_argument("pool", help="dgx, ovx or jetson (or their PHYSAI_POOL_<X> names)")
    worker.add_argument("--type", default=None,
                        help="worker type (default: the pool's; process for a new pool)")
    worker.add_argument("--name", default=None, help="worker name shown in the Prefect UI")
    worker.add_argument("--limit", type=int, default=None, help="most flow runs at a time")
    worker.add_argument("--run-once", action="store_true",
                        help="poll once, run what is due, then exit")
    worker.set_defaults(func=cmd_worker)
