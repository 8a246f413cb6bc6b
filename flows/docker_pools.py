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
the deploying process has them, less credentials: the job template, which anyone who can read
the work pool sees, holds URLs without user and password
(:func:`stages.core.settings.travelling_environment`), and a credential a container needs is a
reference to a Prefect Secret block (``flows deploy --docker --secret VAR=BLOCK``), which the
worker resolves as it starts the container. The image is never pulled: it is local, or the
cluster's nodes already hold it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from physai_core.errors import ConfigError, PhysaiError
from stages.core.settings import travelling_environment

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
"""What of the deploying process's environment a container gets beside the project's own
settings (never credentials: those are Secret blocks the template names)."""
KEPT_OUT = ("PHYSAI_POOL_", "PHYSAI_PODMAN", "PHYSAI_IMAGE", "PHYSAI_CODE_REVISION")
"""The project's settings that describe this machine or the image, not the state."""
SECRET_REFERENCE = "{{{{ prefect.blocks.secret.{block} }}}}"
"""How a job template names a Prefect Secret block's value, which the worker fills in when it
starts a flow run's container (Prefect's block placeholder)."""
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BLOCK = re.compile(r"[a-z0-9][a-z0-9-]*")
"""A block name Prefect accepts: lowercase letters, digits and dashes."""


def container_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that locate the store, MLflow and Prefect's state, their
    URLs without credentials.

    Raises:
        ConfigError: one of them holds a credential still (named, not shown).
    """
    return travelling_environment(environ, PASSED_VARIABLES, KEPT_OUT)


def secret_references(specs: Sequence[str]) -> dict[str, str]:
    """``VAR=BLOCK`` specs as the environment a container gets: each variable the placeholder
    of its Secret block (:data:`SECRET_REFERENCE`), never a value.

    Raises:
        ConfigError: a spec that is not ``VAR=BLOCK`` with a block name Prefect accepts.
    """
    references: dict[str, str] = {}
    for spec in specs:
        var, _, block = spec.partition("=")
        if not (_VARIABLE.fullmatch(var) and _BLOCK.fullmatch(block)):
            raise ConfigError.one("flows deploy", "--secret", spec.partition("=")[0] + "=...",
                                  "expected VAR=BLOCK: an environment variable and the name of "
                                  "a Prefect Secret block (lowercase letters, digits, dashes)")
        references[var] = SECRET_REFERENCE.format(block=block)
    return references


def _volume(spec: str) -> str:
    """``SRC:DST[:ro|rw]`` with an absolute ``SRC`` (a relative one is resolved here)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[1].startswith("/") or (
            len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ConfigError.one("flows deploy", "--volume", spec,
                              "expected SRC:DST or SRC:DST:ro with DST an absolute path")
    parts[0] = os.path.abspath(parts[0])
    return ":".join(parts)


def referenced_secrets(template: Mapping[str, Any]) -> list[str]:
    """The Secret blocks a job template's default environment names (:data:`SECRET_REFERENCE`),
    sorted."""
    env = template.get("variables", {}).get("properties", {}).get("env", {}).get("default")
    values = env.values() if isinstance(env, dict) else ()
    return sorted({m for v in values if isinstance(v, str)
                   for m in re.findall(r"prefect\.blocks\.secret\.([a-z0-9-]+)", v)})


def docker_template(computer: str, volumes: Sequence[str] = (),
                    environ: Mapping[str, str] | None = None,
                    secrets: Sequence[str] = ()) -> dict[str, Any]:
    """The base job template of ``computer``'s Docker pool: Prefect's own, with its image, host
    networking, the state folder and ``volumes`` mounted, the settings (``secrets``, ``VAR=BLOCK``,
    as references to Prefect Secret blocks), explicit limits and no pulling as defaults.

    Raises:
        PhysaiError: ``prefect-docker`` is not installed.
        ConfigError: a setting that would be written into the template holds a credential, or
            a ``secrets`` spec is malformed.
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
        "env": {**container_environment({**environ, "PHYSAI_HOME": home}),
                **secret_references(secrets)},
        "container_create_kwargs": {"ulimits": [dict(u) for u in ULIMITS]},
    }
    for name, value in defaults.items():
        props[name]["default"] = value
    return template
