"""Kubernetes base job templates of the work pools: load, render a stage's Job manifest, and
check it against the Kubernetes API models (the ``kubernetes`` client's), with no cluster."""

from __future__ import annotations

import copy
import difflib
import functools
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from physai_core.errors import BackendUnavailableError, ConfigError, Problem

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


def load_job_template(path: Path) -> dict[str, Any]:
    """Read a Kubernetes base job template and check it the way the Prefect server does: a
    ``job_configuration`` with a ``job_manifest``, a ``variables`` schema declaring every
    placeholder."""
    from prefect.utilities.templating import find_placeholders

    from stages.core.loading import read_yaml

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
