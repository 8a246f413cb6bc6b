"""Scale-out: each stage as a flow run on its computer's work pool, artifacts passed as digests.

``flows deploy`` deploys :func:`stage_flow` once per computer (``stage/dgx``, ``stage/ovx``,
``stage/jetson``). A pipeline run with ``dispatch=True`` then runs each stage with
``run_deployment`` on the deployment of the stage's computer (from the stage table,
:data:`stages.orchestration.stage_table.STAGES`): the worker polling that computer's pool picks it
up, loads the upstream artifacts from the shared artifact store by digest (verifying them), runs
the stage through the same cached task as a single-process run, and returns the new
artifact's record. Nothing but digests and records crosses computers; payloads stay in the
store.

A dgx stage's flow run gets the job variables of its ``resources`` that the pool declares
(GPUs, CPU, memory), less ``command``: a stage asking for several processes starts torchrun
itself. The ``env`` the pipeline's own flow run was started with reaches every stage's flow run
(a setting given to one run, such as a crash point of :mod:`stages.core.crash`). Records come back
as persisted flow-run results, so workers and the dispatching run must share Prefect's result
storage (one machine, or a shared results block on a cluster).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefect import flow

from flows.images import IMAGE_VARIABLE
from physai_core.errors import PhysaiError
from stages.artifacts.records import ArtifactBase
from stages.orchestration.context import open_services
from stages.orchestration.stage_table import stage_def
from stages.pipeline.config import ResolvedPipeline, load_pipeline

log = logging.getLogger(__name__)

STAGE_FLOW = "stage"
"""Name of :func:`stage_flow`; its deployments are named after the computers."""
STAGE_ENTRYPOINT = "flows/dispatch.py:stage_flow"
IMAGE_TAG = "physai.image"
"""Tag prefix on the pipeline's MLflow run: ``physai.image.<stage>`` = the stage's image."""

@flow(name=STAGE_FLOW, flow_run_name="{stage}: {config_path}", persist_result=True,
      result_serializer="json")
def stage_flow(
    config_path: str,
    stage: str,
    run_id: str,
    inputs: dict[str, str | None],
    refresh: bool = False,
) -> dict[str, Any]:
    """Run one stage of the pipeline in ``config_path`` on this worker's computer.

    ``inputs`` maps each upstream role to an artifact digest (or None); ``run_id`` is the
    pipeline's parent MLflow run. Returns ``{"result": record, "cached": [stage names]}``.
    """
    from flows.stage_tasks import StageRunner, deployed_config, run_stage

    defn = stage_def(stage)
    missing = [role for role in defn.inputs if role not in inputs]
    if missing:
        raise PhysaiError(f"stage {stage!r} needs inputs {missing}")
    pipeline = load_pipeline(deployed_config(config_path))
    _, store, lineage = open_services()
    got = {role: store.get(digest) if (digest := inputs[role]) else None
           for role in defn.inputs}
    run = StageRunner(refresh)
    result = run_stage(run, stage, pipeline, run_id, got)
    image = os.environ.get(IMAGE_VARIABLE)
    if image:
        # The lineage names the image each stage ran in (a container of a Docker pool).
        lineage.call("set_tag", run_id, f"{IMAGE_TAG}.{stage}", image)
    return {"result": result.model_dump(mode="json"), "cached": run.cached}


@dataclass(eq=False)
class RemoteStages:
    """Runs stages as flow runs of ``stage/<computer>`` and collects their records."""

    pipeline: ResolvedPipeline
    config_path: str
    run_id: str
    refresh: bool
    poll_interval: float = 1.0
    """Seconds between two looks at a running stage's flow run."""
    cached: list[str] = field(default_factory=list, init=False)
    """Names of the stage tasks that were cache hits, over every dispatched stage."""
    workers: dict[str, str] = field(default_factory=dict, init=False)
    """Stage -> work pool of the flow run that ran it."""

    def __call__(self, stage: str, **inputs: ArtifactBase | None) -> Any:
        """Run ``stage`` on its computer's pool with ``inputs``; returns its typed record."""
        from prefect.client.schemas.objects import FlowRun
        from prefect.deployments import run_deployment

        defn = stage_def(stage)
        computer = defn.computer
        parameters = {
            "config_path": self.config_path, "stage": stage, "run_id": self.run_id,
            "inputs": {role: (a.digest if a is not None else None) for role, a in inputs.items()},
            "refresh": self.refresh,
        }
        name = f"{STAGE_FLOW}/{computer}"
        flow_run = run_deployment(name, parameters=parameters,
                                  job_variables=self._job_variables(stage),
                                  timeout=None, poll_interval=self.poll_interval)
        if not isinstance(flow_run, FlowRun):
            raise TypeError("run_deployment returned a coroutine in a synchronous flow")
        state = flow_run.state
        if state is None or not state.is_completed():
            raise PhysaiError(
                f"stage {stage} on {computer}'s pool {flow_run.work_pool_name}: flow run "
                f"{flow_run.name} ended {state.name if state else 'without a state'}"
                f"{': ' + state.message if state is not None and state.message else ''}")
        out: Mapping[str, Any] = state.result()
        self.cached += list(out["cached"])
        self.workers[stage] = str(flow_run.work_pool_name)
        log.info("stage %s ran on pool %s (flow run %s)", stage, flow_run.work_pool_name,
                 flow_run.name)
        return defn.result_type.model_validate(out["result"])

    def _job_variables(self, stage: str) -> dict[str, Any]:
        """The stage's job variables its pool's template declares, less ``command``, with the
        ``env`` this pipeline run was started with (:func:`with_run_env`)."""
        from prefect import get_client
        from prefect.runtime import flow_run

        from flows.workpools import job_variables

        planned = job_variables(self.pipeline, stage)
        with get_client(sync_client=True) as client:
            pool = client.read_work_pool(planned["work_pool"])
        declared = pool.base_job_template.get("variables", {}).get("properties", {})
        run_env = (flow_run.job_variables or {}).get("env") or {}
        return fit_job_variables(with_run_env(planned["job_variables"], run_env), declared,
                                 stage, pool.name)


def with_run_env(planned: Mapping[str, Any], run_env: Mapping[str, str]) -> dict[str, Any]:
    """A stage's planned job variables with the ``env`` its pipeline's own flow run was started
    with (``run_deployment(..., job_variables={"env": {...}})``) beneath the stage's own.

    The settings a caller gives one pipeline run reach every stage's flow run, as they reach
    every stage of a run in one process; the worker adds them to the pool's environment (its
    Secret block references included). The stage's own variables (its CPU threads) win a clash.
    """
    return {**planned, "env": {**run_env, **planned.get("env", {})}}


REQUESTS = {"gpus_per_node": 0, "cpu": None, "memory": None}
"""Job variables that ask the pool for hardware, with the value that asks for nothing."""


def fit_job_variables(
    planned: Mapping[str, Any], declared: Mapping[str, Any], stage: str, pool: str
) -> dict[str, Any]:
    """The planned job variables that the pool's template declares, less ``command``.

    A hardware request (GPUs, CPU, memory) that the template cannot take is refused, naming the
    pool and the variable, rather than dropped: the stage would run without what it asked for.
    """
    for name, nothing in REQUESTS.items():
        if planned.get(name, nothing) != nothing and name not in declared:
            raise PhysaiError(
                f"stage {stage}: work pool {pool!r} cannot honour {name}={planned[name]!r} "
                "(its job template declares no such variable); deploy a pool that does "
                "(flows deploy --kubernetes) or drop it from the stage's resources")
    return {k: v for k, v in planned.items() if k in declared and k != "command"}
