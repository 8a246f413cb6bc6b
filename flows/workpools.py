"""Which computer's work pool runs each stage, and what a stage asks of it.

The three computers map to three Prefect work pools (names overridable by settings):
training stages go to ``dgx``, simulation to ``ovx``, on-robot steps to ``jetson``. A training
stage's ``resources`` (nodes, processes and GPUs per node, CPU, memory) become the job
variables of its flow run in the ``dgx`` pool, so a Kubernetes job template can request
``nvidia.com/gpu`` and start ``torchrun`` with the right process count.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from stages.orchestration.stage_table import COMPUTERS, stage_def
from stages.pipeline.config import ResolvedPipeline
from stages.sections.models import Resources


def work_pool(computer: str) -> str:
    """The work pool of ``computer``: ``PHYSAI_POOL_<COMPUTER>`` or the computer's name."""
    if computer not in COMPUTERS:
        raise KeyError(f"unknown computer {computer!r}; valid: {', '.join(COMPUTERS)}")
    return os.environ.get(f"PHYSAI_POOL_{computer.upper()}", computer)


def stage_resources(pipeline: ResolvedPipeline, stage: str) -> Resources:
    """What ``stage`` asks for: its config's ``resources``, or one process when it has none."""
    resources = getattr(getattr(pipeline.config, stage_def(stage).section), "resources", None)
    return resources if isinstance(resources, Resources) else Resources()


def _cpu_threads(res: Resources) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for a stage on CPUs alone: its processes share the CPUs it asks
    for (one thread each when it asks for several processes and no CPU count). One process
    that names no CPU count gets no setting: torch uses every CPU its container sees, as the
    same stage in-process does, so both train the same bytes."""
    if res.gpus_per_node > 0:
        return {}
    if res.cpus_per_node is not None:
        return {"OMP_NUM_THREADS": str(max(1, int(res.cpus_per_node) // res.nproc_per_node))}
    return {"OMP_NUM_THREADS": "1"} if res.nproc_per_node > 1 else {}


def job_variables(pipeline: ResolvedPipeline, stage: str) -> dict[str, Any]:
    """Job variables of ``stage``'s flow run in its computer's work pool.

    ``command`` runs the stage under torchrun when it asks for more than one process; the
    rendezvous endpoint of a multi-node job comes from ``PHYSAI_RDZV_ENDPOINT`` on the nodes.
    """
    from stages.pipeline.launch import torchrun_command

    res = stage_resources(pipeline, stage)
    variables: dict[str, Any] = {
        "nodes": res.nodes,
        "nproc_per_node": res.nproc_per_node,
        "gpus_per_node": res.gpus_per_node,
        "env": _cpu_threads(res),
    }
    if res.cpus_per_node is not None:
        variables["cpu"] = res.cpus_per_node
    if res.memory_gb is not None:
        variables["memory"] = f"{res.memory_gb:g}Gi"
    from stages.sim.backends.catalog import get_backend

    environment = (pipeline.config.validate_.environment
                   or get_backend(pipeline.suite.config.backend).environment)
    if environment is not None and stage in ("validate", "validate-scene"):
        from stages.core.environments import get_environment

        image = get_environment(environment).image
        if image:
            variables["image"] = image
    if res.nodes * res.nproc_per_node > 1:
        cmd = torchrun_command(res, Path(pipeline.path), stage,
                               rdzv_endpoint="$(PHYSAI_RDZV_ENDPOINT)" if res.nodes > 1 else None)
        cmd[0] = "python"
        variables["command"] = shlex.join(cmd)
    return {"work_pool": work_pool(stage_def(stage).computer), "job_variables": variables}
