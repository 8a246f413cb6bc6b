"""Task runners the pipeline can fan validation scenes out on: threads here, or a Ray cluster.

On a Ray cluster, each task carries the driver's settings (store, MLflow, Prefect, ``PHYSAI_*``)
in its runtime environment, so a node started by ``ray start`` elsewhere publishes into the
driver's store; never its credentials (a runtime environment is visible to whoever can list the
cluster's jobs): URLs travel without user and password, and each node takes its own.

A cluster whose nodes advertise computers as custom resources (``ray start
--resources='{"ovx": 1}'``) runs each task on a node of its stage's computer, records in the
pipeline's MLflow run where it ran, and fails the stage in one line when no live node offers
that computer any more.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from physai_core.errors import BackendUnavailableError, PhysaiError
from stages.core.settings import (
    LOCATION_VARIABLES,
    embedded_environment,
    resolve_settings,
    travelling_environment,
)
from stages.orchestration.stage_table import COMPUTERS, stage_def

log = logging.getLogger(__name__)

RunnerKind = Literal["threads", "ray"]
RAY_OBJECT_STORE_BYTES = 256 << 20
SIM_THREADS_ENV = "PHYSAI_SIM_THREADS"
WORKER_VARIABLES = (*LOCATION_VARIABLES, "MUJOCO_GL", "PYOPENGL_PLATFORM",
                    "PREFECT_RESULTS_PERSIST_BY_DEFAULT")
"""Variables a Ray task takes from the driver beside the project's own and the embedded
Prefect settings: where state lives and how simulators render
(:func:`stages.core.settings.travelling_environment`)."""
PATH_VARS = ("PHYSAI_HOME", "PHYSAI_STORE", "PHYSAI_MLFLOW_ARTIFACTS", "PREFECT_HOME",
             "PREFECT_LOCAL_STORAGE_PATH")
SCENE_TASKS = {"validate-scene": "validate"}
"""Tasks that run one part of a stage, by task name: the stage whose computer they run on."""
RESOURCE_SHARE = 0.01
"""How much of its computer's custom resource one task asks for: a node's CPUs, not this,
bound how many run on it at once."""
TASK_MAX_RETRIES = 3
"""Runs of a task after the first that Ray makes when its worker or node dies."""
NODE_GRACE_S = 20.0
"""How long a task waits for a node of its computer to come back before its stage fails (s)."""
POLL_S = 1.0


def make_task_runner(kind: RunnerKind, address: str | None = None) -> Any:
    """A Prefect task runner: a thread pool in this process, or Ray (``address`` None starts a
    local instance with a small object store and no dashboard).

    Scenes then run side by side, one per CPU, so each simulator steps on one thread
    (``PHYSAI_SIM_THREADS``) unless the environment says otherwise.
    """
    cpus = os.cpu_count() or 1
    if kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        os.environ.setdefault(SIM_THREADS_ENV, "1")
        return ThreadPoolTaskRunner(max_workers=cpus)
    worker_environment()  # what tasks will carry is refused now, before the flow starts
    try:
        runner = placed_ray_runner()
    except ImportError as exc:
        raise BackendUnavailableError("ray", "ray", exc) from None
    os.environ.setdefault(SIM_THREADS_ENV, "1")
    if address:
        return runner(address=address)
    return runner(
        init_kwargs={
            "num_cpus": cpus,
            "include_dashboard": False,
            "object_store_memory": RAY_OBJECT_STORE_BYTES,
        }
    )


@contextmanager
def api_for_workers(kind: RunnerKind) -> Iterator[None]:
    """Make sure task runs in other processes report to the flow's Prefect API.

    Without ``PREFECT_API_URL`` a flow talks to a temporary server that only its own process
    knows; Ray workers would each start another one. For Ray this starts the temporary server
    here and exports its URL, which the workers of a local Ray instance inherit. The server
    stops at interpreter exit, after Prefect has flushed its logs and events to it.
    """
    if kind != "ray" or os.environ.get("PREFECT_API_URL"):
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = SubprocessASGIServer()
    server.start(timeout=120)
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            yield
    finally:
        os.environ.pop("PREFECT_API_URL", None)


def worker_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a Ray task runs with, taken from ``env`` (the process environment by
    default): the resolved locations of the store, MLflow and Prefect state (paths absolute),
    the embedded Prefect settings, :data:`WORKER_VARIABLES` and the project's own settings,
    every URL without its credentials (:func:`stages.core.settings.travelling_environment`).

    Raises:
        ConfigError: a variable that would travel holds a credential (named, not shown).
    """
    env = os.environ if env is None else env
    settings = resolve_settings(env)
    embedded = embedded_environment(settings)
    resolved = {**embedded, **env,
                "PHYSAI_HOME": str(settings.home),
                "PHYSAI_STORE": settings.store_uri,
                "MLFLOW_TRACKING_URI": settings.tracking_uri,
                "PHYSAI_MLFLOW_ARTIFACTS": str(settings.mlflow_artifacts),
                "PREFECT_HOME": str(settings.prefect_home)}
    travel = travelling_environment(resolved, {*WORKER_VARIABLES, *embedded})
    for var in PATH_VARS:
        if "://" not in travel[var]:
            travel[var] = str(Path(travel[var]).absolute())
    return travel


def task_computer(task_name: str) -> str | None:
    """The computer a Prefect task of this name runs on: its stage's, or None for a task of
    no stage (opening and closing the run)."""
    stage = SCENE_TASKS.get(task_name, task_name)
    try:
        return stage_def(stage).computer
    except KeyError:
        return None


def live_offers(computer: str) -> bool:
    """Whether a live node of the connected Ray cluster offers the custom resource
    ``computer``."""
    import ray

    return any(n.get("Alive") and n.get("Resources", {}).get(computer, 0) > 0
               for n in ray.nodes())


class NoNodeError(PhysaiError):
    """A stage's task whose computer no live Ray node offers any more."""

    def __init__(self, stage: str, computer: str) -> None:
        super().__init__(
            f"{stage}: no live Ray node offers the resource {computer!r} (the {computer} pool) "
            f"for {NODE_GRACE_S:g} s; start one with ray start --address=HEAD "
            f"--resources='{{\"{computer}\": 1}}'")


def record_placement(task_name: str, parameters: Mapping[str, Any]) -> None:
    """Tag the pipeline's MLflow run (``parameters["run_id"]``) with where this Ray task runs:
    ``physai.ray.<task>[.<scene>]`` = node id, IP address, the computers the node offers and
    the Ray task id (which the state API lists). Runs inside the task, on its node."""
    import ray

    from stages.orchestration.context import open_services

    run_id = parameters.get("run_id")
    if not isinstance(run_id, str):
        return
    context = ray.get_runtime_context()
    node = context.get_node_id()
    offers: dict[str, float] = next(
        (n.get("Resources", {}) for n in ray.nodes() if n.get("NodeID") == node), {})
    computers = ",".join(c for c in COMPUTERS if offers.get(c, 0) > 0) or "none"
    scene = parameters.get("scene_name")
    key = f"physai.ray.{task_name}" + (f".{scene}" if isinstance(scene, str) else "")
    value = (f"node={node} ip={ray.util.get_node_ip_address()} resources={computers} "
             f"task={context.get_task_id()}")
    open_services()[2].call("set_tag", run_id, key, value)


def placed_ray_future() -> type[Any]:
    """The class of a task's future on a cluster that places tasks by computer (prefect-ray
    imported)."""
    from prefect_ray.task_runners import PrefectRayFuture

    class PlacedRayFuture(PrefectRayFuture[Any]):
        """A task's future that fails when no live node offers its computer any more."""

        stage: str = ""
        computer: str = ""

        def _ready(self, timeout: float | None) -> bool:
            import ray

            deadline = None if timeout is None else time.monotonic() + timeout
            gone_since: float | None = None
            while not ray.wait([self.wrapped_future], timeout=POLL_S)[0]:
                now = time.monotonic()
                if live_offers(self.computer):
                    gone_since = None
                elif gone_since is None:
                    gone_since = now
                elif now - gone_since > NODE_GRACE_S:
                    ray.cancel(self.wrapped_future, force=True)
                    raise NoNodeError(self.stage, self.computer)
                if deadline is not None and now > deadline:
                    return False
            return True

        def wait(self, timeout: float | None = None) -> None:
            if self._final_state or self._ready(timeout):
                super().wait(timeout)

        def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any:
            if not self._final_state and not self._ready(timeout):
                raise TimeoutError(f"Task run {self.task_run_id} did not complete within "
                                   f"{timeout} seconds")
            return super().result(timeout, raise_on_failure)

    return PlacedRayFuture


def placed_ray_runner() -> type[Any]:
    """The Ray task runner class that places tasks by computer (prefect-ray imported)."""
    from prefect_ray import RayTaskRunner
    from prefect_ray.context import remote_options

    future_class = placed_ray_future()

    class PlacedRayTaskRunner(RayTaskRunner):
        """prefect-ray's runner whose tasks carry the driver's settings and, on a cluster that
        advertises computers, run on a node of their stage's computer."""

        def __enter__(self) -> Any:
            import ray

            if not ray.is_initialized():
                runtime = dict(self.init_kwargs.get("runtime_env") or {})
                runtime["env_vars"] = {**worker_environment(), **runtime.get("env_vars", {})}
                self.init_kwargs["runtime_env"] = runtime
            super().__enter__()
            self.computers = {c for c in COMPUTERS if ray.cluster_resources().get(c, 0) > 0}
            if self.computers:
                log.info("Ray nodes offer %s: tasks run on their computer's nodes",
                         ", ".join(sorted(self.computers)))
            return self

        def places(self, task_name: str) -> bool:
            """Whether a task of this name runs on a node of its computer: the cluster
            offered that computer when the flow started."""
            return task_computer(task_name) in getattr(self, "computers", ())

        def submit(self, task: Any, parameters: dict[str, Any], wait_for: Any = None,
                   dependencies: Any = None) -> Any:
            computer = task_computer(task.name)
            if not getattr(self, "computers", None) or computer is None:
                return super().submit(task, parameters, wait_for, dependencies)
            with remote_options(resources={computer: RESOURCE_SHARE},
                                max_retries=TASK_MAX_RETRIES):
                future = super().submit(task, parameters, wait_for, dependencies)
            placed = future_class(task_run_id=future.task_run_id,
                                  wrapped_future=future.wrapped_future)
            placed.stage = SCENE_TASKS.get(task.name, task.name)
            placed.computer = computer
            return placed

        @staticmethod
        def _run_prefect_task(*upstream: Any, task: Any, **kwargs: Any) -> Any:
            record_placement(task.name, kwargs.get("parameters") or {})
            return RayTaskRunner._run_prefect_task(*upstream, task=task, **kwargs)

    return PlacedRayTaskRunner
