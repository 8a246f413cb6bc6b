"""Docker work pools: each computer's flow runs in a container of its environment's image.

``flows deploy --docker`` makes the three pools of type ``docker`` (Prefect's Docker worker,
``prefect-docker``, the ``docker`` extra), whose base job template runs a flow run in the image
:func:`flows.images.image_name` names for the computer's environment, built by ``make images``.
A Docker-compatible API serves the containers: Docker's, a cluster's, or podman's
(``podman --runtime runc system service --time=0 unix:///PATH/podman.sock`` with
``DOCKER_HOST=unix:///PATH/podman.sock`` in the worker's environment).

A container reaches the Prefect and MLflow servers over the host's network, sees the state
folder (``PHYSAI_HOME``: the store, Prefect's result storage, local MLflow artifacts) mounted at
the same path, and gets the settings that locate them (``PHYSAI_*``, MLflow's and Prefect's) as
the deploying process has them. The image is never pulled: it is local, or the cluster's nodes
already hold it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from stages.errors import ConfigError, PhysaiError

COMPUTER_ENVIRONMENTS = {"dgx": "physai", "ovx": "physai", "jetson": "jetson"}
"""The image environment each computer's pool runs by default (``jetson``: the robot
computer's x86 stand-in, :data:`flows.images.RECIPES`); a stage that names a stage environment
of its own gets that environment's image as a job variable."""

ULIMITS = ({"Name": "nofile", "Soft": 1024, "Hard": 1024},
           {"Name": "nproc", "Soft": 4096, "Hard": 4096})
"""Explicit limits: podman on this machine kind refuses a container without them."""

PASSED_PREFIXES = ("PHYSAI_",)
PASSED_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_S3_ENDPOINT_URL", "PREFECT_HOME",
                    "PREFECT_LOCAL_STORAGE_PATH", "PREFECT_SERVER_ANALYTICS_ENABLED",
                    "PREFECT_LOGGING_TO_API_BATCH_INTERVAL", "PREFECT_RESULTS_PERSIST_BY_DEFAULT",
                    "MUJOCO_GL")
"""What of the deploying process's environment a container gets (never credentials: those
belong in the worker's environment or a secret store)."""
KEPT_OUT = ("PHYSAI_POOL_", "PHYSAI_PODMAN", "PHYSAI_IMAGE", "PHYSAI_CODE_REVISION")


def container_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that locate the store, MLflow and Prefect's state."""
    return {k: v for k, v in sorted(environ.items())
            if (k.startswith(PASSED_PREFIXES) or k in PASSED_VARIABLES)
            and not k.startswith(KEPT_OUT) and "SECRET" not in k and "KEY" not in k}


def _volume(spec: str) -> str:
    """``SRC:DST[:ro|rw]`` with an absolute ``SRC`` (a relative one is resolved here)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[1].startswith("/") or (
            len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ConfigError.one("flows deploy", "--volume", spec,
                              "expected SRC:DST or SRC:DST:ro with DST an absolute path")
    parts[0] = os.path.abspath(parts[0])
    return ":".join(parts)


def docker_template(computer: str, volumes: Sequence[str] = (),
                    environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The base job template of ``computer``'s Docker pool: Prefect's own, with its image, host
    networking, the state folder and ``volumes`` mounted, the settings, explicit limits and no
    pulling as defaults.

    Raises:
        PhysaiError: ``prefect-docker`` is not installed.
    """
    try:
        from prefect_docker.worker import DockerWorker
    except ImportError as exc:
        raise PhysaiError("Docker work pools need prefect-docker: pip install "
                          "'physai-flows[docker]'") from exc
    from flows.images import image_name

    environ = os.environ if environ is None else environ
    home = os.path.abspath(environ.get("PHYSAI_HOME") or ".physai")
    template = DockerWorker.get_default_base_job_template()
    props = template["variables"]["properties"]
    defaults: dict[str, Any] = {
        "image": image_name(COMPUTER_ENVIRONMENTS[computer]),
        "network_mode": "host",
        "image_pull_policy": "Never",
        "auto_remove": True,
        "volumes": [f"{home}:{home}", *map(_volume, volumes)],
        "env": container_environment({**environ, "PHYSAI_HOME": home}),
        "container_create_kwargs": {"ulimits": [dict(u) for u in ULIMITS]},
    }
    for name, value in defaults.items():
        props[name]["default"] = value
    return template
