"""Where state lives. Every location defaults under ``.physai/`` and is overridable by environment.

| variable | default | what |
|---|---|---|
| ``PHYSAI_HOME`` | ``./.physai`` | root of all embedded state |
| ``PHYSAI_STORE`` | ``$PHYSAI_HOME/store`` | artifact store: a folder or ``s3://bucket/prefix`` |
| ``PHYSAI_S3_ENDPOINT_URL`` | unset (AWS) | endpoint of an S3-compatible server |
| ``MLFLOW_TRACKING_URI`` | ``sqlite:///$PHYSAI_HOME/mlflow.db`` | MLflow tracking and registry |
| ``PREFECT_HOME`` | ``$PHYSAI_HOME/prefect`` | Prefect's database and cached results |
| ``PHYSAI_SIM_THREADS`` | CPU count, 1 per scene in fan-out | simulator stepping threads |
| ``PHYSAI_SIGNING_KEY`` | ``$PHYSAI_HOME/keys/bundle-signing.key`` | key that signs bundles |
| ``PHYSAI_BUNDLE_MAX_BYTES`` | 1 GiB | most bytes a bundle may unpack to |
| ``PHYSAI_DATASET_MAX_BYTES`` | a quarter of physical memory | most bytes a dataset may declare |
| ``PHYSAI_POLICY_API_KEY`` | unset (no key) | key a policy server asks for and a client sends |
| ``PHYSAI_WORKER_ENV`` | unset | further variables that travel to Ray tasks and containers |

What travels to another machine (a Ray task's runtime environment, a Docker pool's job template)
is an allowlist of these locations (:func:`travelling_environment`), each URL without its user,
password and secret-named query parameters: credentials stay on the machine that has them, and
each node or container takes its own from its environment or a Prefect Secret block.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from physai_core.errors import ConfigError, Problem
from stages.core.limits import MAX_PROCS_PER_NODE, MAX_THREADS
from stages.core.redaction import (
    REDACTED,
    known_credential,
    redact_setting,
    secret_name,
    strip_url_credentials,
)

log = logging.getLogger(__name__)

TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https",
                    "databricks", "databricks-uc")
"""URI schemes of an MLflow tracking store (``postgresql+psycopg2://`` counts as postgresql)."""
LOCATION_VARIABLES = ("PHYSAI_HOME", "PHYSAI_STORE", "PHYSAI_S3_ENDPOINT_URL",
                      "PHYSAI_MLFLOW_ARTIFACTS", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI",
                      "MLFLOW_S3_ENDPOINT_URL", "PREFECT_API_URL", "PREFECT_HOME",
                      "PREFECT_LOCAL_STORAGE_PATH", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION",
                      "AWS_REGION")
"""Where state lives: the settings that travel to Ray tasks (containers take those of
:data:`flows.docker_pools.PASSED_VARIABLES`), their URLs without credentials."""
PROJECT_PREFIX = "PHYSAI_"
"""The project's own settings travel too, less those named like a credential (the API keys)."""
WORKER_ENV = "PHYSAI_WORKER_ENV"
"""Names (comma- or space-separated) of further variables that travel to Ray tasks and
containers; one named like a credential is refused."""
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Settings:
    """Resolved locations of the store, MLflow and Prefect state."""

    home: Path
    store_uri: str
    s3_endpoint_url: str | None
    tracking_uri: str
    mlflow_artifacts: Path
    prefect_home: Path

    @property
    def embedded_mlflow(self) -> bool:
        """True when MLflow runs in-process on a local database rather than behind a server."""
        return not self.tracking_uri.startswith(("http://", "https://"))


def resolve_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Resolve settings from ``env`` (default: the process environment). Creates nothing.

    Raises:
        ConfigError: the store, the S3 endpoint or the MLflow tracking URI names no place a
            client can read (:func:`_address_problems`), before a client meets it as a
            traceback: one problem per variable, its password redacted; exit status 2.
    """
    env = os.environ if env is None else env
    if problems := _address_problems(env):
        raise ConfigError(problems)
    home = Path(env.get("PHYSAI_HOME") or ".physai").absolute()
    return Settings(
        home=home,
        store_uri=env.get("PHYSAI_STORE") or str(home / "store"),
        s3_endpoint_url=env.get("PHYSAI_S3_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL") or None,
        tracking_uri=env.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}",
        mlflow_artifacts=Path(env.get("PHYSAI_MLFLOW_ARTIFACTS") or home / "mlartifacts"),
        prefect_home=Path(env.get("PREFECT_HOME") or home / "prefect").absolute(),
    )


def apply_embedded_environment(settings: Settings) -> None:
    """Set Prefect's variables for embedded state, keeping any the environment already has.

    Creates the Prefect home folder, which Prefect itself does not create with its parents.
    """
    for key, value in embedded_environment(settings).items():
        os.environ.setdefault(key, value)
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)


def embedded_environment(settings: Settings) -> dict[str, str]:
    """Environment variables that make Prefect run embedded under ``settings.home``.

    Prefect reads its settings when first imported, so callers apply these before that import.
    """
    return {
        "PREFECT_HOME": str(settings.prefect_home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOCAL_STORAGE_PATH": str(settings.prefect_home / "storage"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.5",
        "GIT_PYTHON_REFRESH": "quiet",
    }


def sim_threads(env: Mapping[str, str] | None = None) -> int | None:
    """``PHYSAI_SIM_THREADS`` as a thread count (None: unset); anything but a whole number
    from 1 to :data:`~stages.core.limits.MAX_THREADS` is a :class:`ConfigError` naming it."""
    env = os.environ if env is None else env
    value = env.get("PHYSAI_SIM_THREADS", "").strip()
    if not value:
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_THREADS:
        raise ConfigError.one("environment", "PHYSAI_SIM_THREADS", value,
                              f"must be a number of stepping threads, 1 to {MAX_THREADS:,}")
    return int(value)


def camera_tiles(env: Mapping[str, str] | None = None) -> str:
    """``PHYSAI_CAMERA_TILES`` as ``off``, ``on``, ``auto`` (also when unset) or a process
    count up to :data:`~stages.core.limits.MAX_PROCS_PER_NODE`; anything else is a
    :class:`ConfigError` naming it."""
    env = os.environ if env is None else env
    raw = env.get("PHYSAI_CAMERA_TILES", "")
    text = raw.strip().lower() or "auto"
    if text in ("off", "on", "auto") or (text.isdigit() and int(text) <= MAX_PROCS_PER_NODE):
        return text
    raise ConfigError.one("environment", "PHYSAI_CAMERA_TILES", raw,
                          f"must be off, on, auto or a number of processes (at most "
                          f"{MAX_PROCS_PER_NODE})")


def asked_to_travel(env: Mapping[str, str] | None = None) -> tuple[list[str], list[Problem]]:
    """The variables :data:`WORKER_ENV` names, and a problem for each name that is no variable
    name or is named like a credential (:func:`~stages.core.redaction.secret_name`)."""
    env = os.environ if env is None else env
    names = [n for n in re.split(r"[\s,]+", env.get(WORKER_ENV, "")) if n]
    problems = [Problem("environment", WORKER_ENV, n, "names no environment variable")
                for n in names if not _VARIABLE_NAME.fullmatch(n)]
    problems += [Problem("environment", n, REDACTED,
                         f"is named like a credential and {WORKER_ENV} asks it to travel: "
                         "credentials stay on this machine; give each node its own, and "
                         f"containers a Prefect Secret block (flows deploy --secret {n}=BLOCK)")
                 for n in names if secret_name(n)]
    return [n for n in names if _VARIABLE_NAME.fullmatch(n) and not secret_name(n)], problems


@functools.cache
def _note_stripped(key: str) -> None:
    """Say once a process that ``key`` travels without its URL credentials."""
    log.warning("%s travels without the credentials of its URLs: where it goes, they come "
                "from that machine's own environment or a Prefect Secret block", key)


def travelling_environment(env: Mapping[str, str], names: Collection[str],
                           kept_out: tuple[str, ...] = ()) -> dict[str, str]:
    """The variables of ``env`` that travel to another machine: those of ``names``, the
    project's own (:data:`PROJECT_PREFIX`, less those starting with ``kept_out``) and those
    :data:`WORKER_ENV` names; never one named like a credential, which stays here (a node's
    credentials are its own). Every URL in a value loses its user, password and secret-named
    query parameters (:func:`~stages.core.redaction.strip_url_credentials`).

    Raises:
        ConfigError: a variable asked to travel is named like a credential, or a value still
            holds one after that (a token in a path, a private key, an ``@`` that a client may
            read as the end of a password: :func:`~stages.core.redaction.redact_setting`, so
            also one past a space or a quote): one problem per variable, naming it and not its
            value; exit status 2.
    """
    asked, problems = asked_to_travel(env)
    travel: dict[str, str] = {}
    for key in sorted(env):
        project = key.startswith(PROJECT_PREFIX) and not key.startswith(kept_out)
        if not (key in names or key in asked or project) or secret_name(key):
            continue
        value = strip_url_credentials(env[key])
        if known_credential(value) or redact_setting(value) != value:
            problems.append(Problem("environment", key, REDACTED, "holds a credential, which "
                                    "would travel to other machines; give each its own"))
        elif value != env[key]:
            _note_stripped(key)
        travel[key] = value
    if problems:
        raise ConfigError(problems)
    return travel


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Refuse, before anything is written, a variable of this project's whose value it could
    not use: every problem in one :class:`ConfigError` (exit status 2), each naming the
    variable and its value, URL credentials redacted
    (:func:`~stages.core.redaction.redact_setting`)."""
    env = os.environ if env is None else env
    problems: list[Problem] = []
    for parse in (sim_threads, camera_tiles):
        try:
            parse(env)
        except ConfigError as error:
            problems += error.problems
    problems += asked_to_travel(env)[1]
    home = env.get("PHYSAI_HOME", "")
    if home and Path(home).exists() and not Path(home).is_dir():
        problems.append(Problem("environment", "PHYSAI_HOME", home,
                                "is a file; the state folder must be a folder"))
    problems += _address_problems(env)
    if problems:
        raise ConfigError(problems)


_S3_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")
"""A bucket name as boto3 checks one that is no ARN (S3 itself asks less of old buckets)."""


def _address_problems(env: Mapping[str, str]) -> list[Problem]:
    """A problem for each of the store, the S3 endpoints and the MLflow tracking URI that
    names no place this project can reach, its value shown with URL credentials redacted
    (:func:`~stages.core.redaction.redact_setting`): an unknown scheme, a bucket that is no S3
    bucket name, or a URL urllib cannot read (:func:`_url_fault`), which MLflow and boto3 would
    meet as a traceback deep in their clients."""
    found: list[tuple[str, str]] = []
    store = env.get("PHYSAI_STORE", "")
    if store.startswith("s3://") and not _S3_BUCKET.fullmatch(store[5:].partition("/")[0]):
        found.append(("PHYSAI_STORE", "names no S3 bucket: s3://BUCKET/PREFIX, the bucket of "
                                      "letters, digits, '.', '-' and '_'"))
    elif "://" in store and not store.startswith("s3://"):
        found.append(("PHYSAI_STORE", "must be a folder or s3://BUCKET/PREFIX"))
    for variable in ("PHYSAI_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL"):  # the second: boto3's own
        endpoint = env.get(variable, "")
        if endpoint and (fault := _url_fault(endpoint, web=True)):
            found.append((variable, fault))
    uri = env.get("MLFLOW_TRACKING_URI", "")
    scheme = uri.partition("://")[0].partition("+")[0].lower() if "://" in uri else ""
    if scheme and scheme not in TRACKING_SCHEMES:
        found.append(("MLFLOW_TRACKING_URI", f"unknown scheme {scheme!r}; use one of "
                                             f"{', '.join(TRACKING_SCHEMES)}, or a path"))
    elif scheme and (fault := _url_fault(uri, web=scheme in ("http", "https"))):
        found.append(("MLFLOW_TRACKING_URI", fault))
    return [Problem("environment", key, redact_setting(env[key]), why) for key, why in found]


def _url_fault(url: str, web: bool) -> str | None:
    """Why urllib, which MLflow and boto3 read addresses with, cannot use ``url`` (None: it
    can): a host's ``[`` without its ``]``; for a ``web`` address (http or https) also no
    host, or a port that is no number from 1 to 65535. Said without quoting ``url``."""
    unreachable = "is not an http(s) URL naming a host and a port from 1 to 65535"
    try:
        parts = urlsplit(url)
        if web and not (parts.scheme.lower() in ("http", "https") and parts.hostname
                        and parts.port != 0):
            return unreachable
    except ValueError as exc:  # urllib's reasons may quote the address: none is repeated
        if "Port" in str(exc):
            return unreachable
        return "is not a URL: a host's [ without its ], or a character no URL holds"
    return None
