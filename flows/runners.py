"""Task runners the pipeline can fan validation scenes out on: threads here, or a Ray cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from stages.errors import BackendUnavailableError

RunnerKind = Literal["threads", "ray"]
RAY_OBJECT_STORE_BYTES = 256 << 20
SIM_THREADS_ENV = "PHYSAI_SIM_THREADS"


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
    try:
        from prefect_ray import RayTaskRunner
    except ImportError as exc:
        raise BackendUnavailableError("ray", "ray", exc) from None
    os.environ.setdefault(SIM_THREADS_ENV, "1")
    if address:
        return RayTaskRunner(address=address)
    return RayTaskRunner(
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
