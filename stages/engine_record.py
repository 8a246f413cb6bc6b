"""Record an on-target TensorRT engine build in MLflow as an external model.

The engine itself stays on the robot computer (it runs only on the GPU it was built for), so
MLflow holds its description: an ``engine-build`` run with the report as an artifact and the
check and timing as metrics, and an external LoggedModel (``model_type`` ``tensorrt-engine``)
whose tags carry the engine digest, TensorRT version, GPU and the bundle and policy digests.
The registered model version packaged into that bundle gets a tag pointing at the engine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stages.errors import ConfigError
from stages.lineage import LineageRecorder

EXPERIMENT = "edge-engines"
"""MLflow experiment of engine builds unless told otherwise."""

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "format": int, "engine_sha256": str, "engine_bytes": int, "precision": str, "builder": str,
    "tensorrt": str, "gpu": str, "compute_capability": str, "target": str, "onnx_sha256": str,
    "lineage": dict, "check": dict, "latency_budget_ms": (int, float), "passed": bool,
    "build_seconds": (int, float), "command": str,
}
_CHECK = ("samples", "max_abs_diff", "tolerance", "passed", "latency_p50_us", "latency_p99_us")


def build_from_bundle(
    bundle: Path,
    out_dir: Path,
    *,
    precision: str | None = None,
    builder: str = "python",
    any_gpu: bool = False,
) -> dict[str, Any]:
    """Check the bundle whole, unpack it to a scratch folder and run its on-target engine
    build into ``out_dir``; return the report. A machine without TensorRT, or a bundle the
    target cannot build, stops with a one-line error (exit status 2)."""
    import tempfile

    from edge import engine
    from edge.bundle import unpack_bundle
    from edge.errors import TargetError
    from edge.manifest import check_bundle

    check_bundle(bundle)
    with tempfile.TemporaryDirectory(prefix="physai-engine-") as scratch:
        root = Path(scratch) / "bundle"
        unpack_bundle(bundle, root)
        try:
            plan = engine.plan_build(root, precision=precision, builder=builder,
                                     out_dir=out_dir)
            return engine.run(plan, any_gpu=any_gpu)
        except engine.EngineBuildError as exc:
            raise TargetError(str(exc)) from None


def read_engine_report(path: Path) -> dict[str, Any]:
    """Load and check an ``engine_report.json``; a bad file names the field and value."""
    try:
        report = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError.one(path, "", None, "engine report not found") from None
    except ValueError as exc:
        raise ConfigError.one(path, "", None, f"not JSON ({exc})") from None
    check_engine_report(report, path)
    return dict(report)


def check_engine_report(report: object, where: Path | str) -> None:
    """Refuse a report missing a field or holding one of the wrong type."""
    if not isinstance(report, dict):
        raise ConfigError.one(where, "", type(report).__name__, "must be a JSON object")
    for field, kind in _REQUIRED.items():
        value = report.get(field)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError.one(where, field, value, "missing or of the wrong type")
    if report["format"] != 1:
        raise ConfigError.one(where, "format", report["format"], "must be 1")
    for field in _CHECK:
        if field not in report["check"]:
            raise ConfigError.one(where, f"check.{field}", None, "missing")


def record_engine(
    report: Mapping[str, Any],
    lineage: LineageRecorder,
    *,
    experiment: str = EXPERIMENT,
    bundle_digest: str | None = None,
    report_path: Path | None = None,
) -> tuple[str, str]:
    """Log ``report`` as an ``engine-build`` run and an external model; return their ids.

    With ``bundle_digest``, every registered model version tagged with that bundle gets
    ``physai.engine.<target>.<precision>`` = the engine digest.
    """
    from mlflow.entities import Metric

    check_engine_report(report, report_path or "engine report")
    check = report["check"]
    policy = report["lineage"].get("policy_digest")
    tags = {
        "physai.engine.sha256": report["engine_sha256"],
        "physai.engine.passed": str(report["passed"]).lower(),
        "physai.tensorrt": report["tensorrt"],
        "physai.gpu": report["gpu"],
        "physai.compute_capability": report["compute_capability"],
        "physai.target": report["target"],
        "physai.precision": report["precision"],
        "physai.onnx.sha256": report["onnx_sha256"],
    }
    if policy:
        tags["physai.policy.digest"] = str(policy)
    if bundle_digest:
        tags["physai.bundle.digest"] = bundle_digest
    params = {k: str(report[k]) for k in ("precision", "builder", "tensorrt", "gpu",
                                          "compute_capability", "target", "engine_bytes")}
    params["command"] = report["command"][:500]
    run = lineage.start_run(experiment, f"engine-{report['target']}-{report['precision']}",
                            {"physai.stage": "engine", **tags})
    run.log_params(params)
    model = lineage.call(
        "create_logged_model", lineage.experiment_id(experiment),
        name=f"{report['target']}-{report['precision']}-engine", source_run_id=run.run_id,
        tags=tags, params=params, model_type="tensorrt-engine",
    )
    now = int(time.time() * 1000)
    metrics = {
        "engine_max_abs_diff": float(check["max_abs_diff"]),
        "engine_tolerance": float(check["tolerance"]),
        "engine_latency_p50_us": float(check["latency_p50_us"]),
        "engine_latency_p99_us": float(check["latency_p99_us"]),
        "latency_budget_ms": float(report["latency_budget_ms"]),
        "build_seconds": float(report["build_seconds"]),
        "engine_bytes": float(report["engine_bytes"]),
    }
    lineage.call("log_batch", run.run_id, metrics=[
        Metric(key, value, now, 0, model_id=model.model_id) for key, value in metrics.items()
    ])
    run.log_dict(dict(report), "engine_report.json")
    lineage.call("finalize_logged_model", model.model_id,
                 "READY" if report["passed"] else "FAILED")
    lineage.end_run(run.run_id, "FINISHED")
    if bundle_digest:
        query = f"tags.`physai.bundle.digest` = '{bundle_digest}'"
        for version in lineage.call("search_model_versions", query):
            lineage.set_version_tags(
                version.name, version.version,
                {f"physai.engine.{report['target']}.{report['precision']}":
                 report["engine_sha256"]},
            )
    return run.run_id, str(model.model_id)


def engine_report_problem(lineage: LineageRecorder, bundle_digest: str) -> str | None:
    """Why no on-target engine report lets the bundle ``bundle_digest`` be promoted, or None
    when one passed (engine check within tolerance, p99 within the bundle's latency budget)."""
    from mlflow.exceptions import MlflowException

    try:
        experiment = lineage.call("get_experiment_by_name", EXPERIMENT)
    except MlflowException:
        experiment = None
    runs = [] if experiment is None else lineage.call(
        "search_runs", [experiment.experiment_id],
        f"tags.`physai.bundle.digest` = '{bundle_digest}'")
    if not runs:
        return (f"no on-target engine report of bundle {bundle_digest[:12]} yet (flows engine "
                "build on the target, or the engine-build deployment on the jetson pool; then "
                "flows promote --version)")
    if any(r.data.tags.get("physai.engine.passed") == "true" for r in runs):
        return None
    worst = runs[0].data
    return (f"the on-target engine report of bundle {bundle_digest[:12]} failed: p99 "
            f"{worst.metrics.get('engine_latency_p99_us', float('nan')) / 1000:.3g} ms vs budget "
            f"{worst.metrics.get('latency_budget_ms', float('nan')):.3g} ms, max abs diff "
            f"{worst.metrics.get('engine_max_abs_diff', float('nan')):.3g}")

