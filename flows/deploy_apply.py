"""Applying a deployment plan: read what the Prefect server holds and write only what differs, so
deploying twice changes nothing."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from flows.deploy_plan import NO_SCHEMA, DeploymentSpec, DeployPlan, Outcome, held_state
from physai_core.errors import ConfigError, PhysaiError

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient


def apply_plan(plan: DeployPlan, client: SyncPrefectClient) -> list[Outcome]:
    """Create what the server lacks and update what differs from ``plan``; leave the rest.

    A pool that exists with another worker type stops everything before anything is written:
    Prefect cannot change a pool's type; so does a Secret block a pool's template names that
    the server does not hold (its flow runs could not start).
    """
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    _check_secrets(plan, client)
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


def _check_secrets(plan: DeployPlan, client: SyncPrefectClient) -> None:
    """Refuse, as one :class:`ConfigError`, the Secret blocks the pools' templates name that
    the server does not hold."""
    from prefect.exceptions import ObjectNotFound

    from flows.docker_pools import referenced_secrets

    missing = []
    for block in sorted({b for p in plan.pools for b in referenced_secrets(p.base_job_template)}):
        try:
            client.read_block_document_by_name(block, "secret", include_secrets=False)
        except ObjectNotFound:
            missing.append(block)
    if missing:
        raise ConfigError.one("flows deploy", "--secret", ", ".join(missing),
                              "no Secret block of this name on the Prefect server; create it "
                              "first (prefect block create secret, or in Python "
                              "Secret(value=...).save(NAME))")


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


def prefect_api_url() -> str:
    """The Prefect API that deployments and workers use; a temporary server would not do."""
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        raise PhysaiError("no Prefect server: start one with `flows server up`, or set "
                          "PREFECT_API_URL (flows deploy --dry-run needs none)")
    return url
