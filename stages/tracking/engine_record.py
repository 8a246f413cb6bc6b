"""Record an on-target TensorRT engine build in MLflow as an external model.

The engine itself stays on the robot computer (it runs only on the GPU it was built for), so
MLflow holds its description: an ``engine-build`` run with the report as an artifact and the
check and timing as metrics, and an external LoggedModel (``model_type`` ``tensorrt-engine``)
whose tags carry the engine digest, TensorRT version, GPU and the bundle and policy digests.
The registered model version packaged into that bundle gets a tag pointing at the engine.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from physai_core.errors import ConfigError
from stages.core.loading import read_json
from stages.tracking.lineage import LineageRecorder

EXPERIMENT = "edge-engines"
"""MLflow experiment of engine builds unless told otherwise."""

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "format": int, "engine_sha256": str, "engine_bytes": int, "precision": str, "builder": str,
    "tensorrt": str, "gpu": str, "compute_capability": str, "target": str, "onnx_sha256": str,
    "lineage": dict, "check": dict, "latency_budget_ms": (int, float), "passed": bool,
    "build_seconds": (int, float), "command": str,
}
_CHECK = ("samples", "max_abs_diff", "tolerance", "passed", "latency_p50_us", "latency_p99_us")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TEXT = re.compile(r"[\x20-\x7e]{1,200}")
"""A report's short text fields (TensorRT version, GPU, target): printable ASCII, one line."""
_COMPUTE_CAPABILITY = re.compile(r"sm_[0-9]{2,3}")


def build_from_bundle(
    bundle: Path,
    out_dir: Path | None,
    *,
    precision: str | None = None,
    builder: str = "python",
    any_gpu: bool = False,
    trust_key: Path | None = None,
    allow_unsigned: bool = False,
) -> tuple[dict[str, Any], str]:
    """Read the bundle file once, check it whole and its signature by ``trust_key`` (without
    one it is refused unless ``allow_unsigned``), extract those bytes to a scratch folder and
    run the bundle's on-target engine build into ``out_dir`` (default:
    ``engine-<bundle sha256[:12]>`` in the working folder); return the report and the bundle's
    sha256. A machine without TensorRT, or a bundle the target cannot build, stops
    with a one-line error (exit status 2)."""
    import tempfile

    from edge import engine
    from edge.bundle import extract_bundle, open_bundle
    from edge.errors import TargetError
    from edge.manifest import check_bundle

    contents = open_bundle(Path(bundle), trust_key=trust_key, allow_unsigned=allow_unsigned)
    check_bundle(contents)
    with tempfile.TemporaryDirectory(prefix="physai-engine-") as scratch:
        root = Path(scratch) / "bundle"
        extract_bundle(contents, root)
        try:
            out = out_dir if out_dir is not None else Path.cwd() / f"engine-{contents.sha256[:12]}"
            plan = engine.plan_build(root, precision=precision, builder=builder, out_dir=out)
            return engine.run(plan, any_gpu=any_gpu), contents.sha256
        except engine.EngineBuildError as exc:
            raise TargetError(str(exc)) from None


def check_bundle_digest(digest: object, where: Path | str, field: str = "--bundle-digest"
                        ) -> str:
    """``digest`` when it is a bundle digest (64 lowercase hex digits, ``sha256:`` allowed
    before them), without the prefix; anything else is refused (it goes into MLflow search
    filters)."""
    text = digest.removeprefix("sha256:") if isinstance(digest, str) else digest
    if not isinstance(text, str) or not _SHA256.fullmatch(text):
        raise ConfigError.one(where, field, str(digest)[:80], "must be a bundle sha256 "
                              "(64 lowercase hex digits)")
    return text


def check_report_matches_bundle(report: Mapping[str, Any], bundle: Path,
                                where: Path | str) -> None:
    """Refuse a report that was not made from the bundle file ``bundle``: its
    ``manifest_sha256`` and ``onnx_sha256`` must be that bundle's."""
    from hashlib import sha256

    from edge.bundle import open_bundle

    contents = open_bundle(bundle)
    manifest_digest = sha256(contents.members["manifest.json"]).hexdigest()
    onnx = contents.manifest["files"].get("policy.onnx", {}).get("sha256")
    for field, want in (("manifest_sha256", manifest_digest), ("onnx_sha256", onnx)):
        if report.get(field) != want:
            raise ConfigError.one(where, field, report.get(field),
                                  f"the bundle {contents.sha256[:12]} has {want}")


def read_engine_report(path: Path) -> dict[str, Any]:
    """Load and check an ``engine_report.json``; a bad file names the field and value."""
    if not Path(path).exists():
        raise ConfigError.one(path, "", None, "engine report not found")
    report = read_json(Path(path))
    check_engine_report(report, path)
    return dict(report)


def check_engine_report(report: object, where: Path | str) -> None:
    """Refuse a report missing a field, holding one of the wrong type or out of range, or
    whose verdicts do not follow from its numbers: digests are sha256 hex, the precision and
    builder known, the tolerance within its precision's bound, the check passed only when
    its largest difference is within the tolerance, and the report passed only when the
    check did and the p99 latency is within the budget."""
    from edge.engine import BUILDERS, PRECISION_TOLERANCE

    if not isinstance(report, dict):
        raise ConfigError.one(where, "", type(report).__name__, "must be a JSON object")
    for field, kind in _REQUIRED.items():
        value = report.get(field)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError.one(where, field, value, "missing or of the wrong type")
    if report["format"] != 1:
        raise ConfigError.one(where, "format", report["format"], "must be 1")
    check = report["check"]
    for field in _CHECK:
        if field not in check:
            raise ConfigError.one(where, f"check.{field}", None, "missing")

    def refuse(field: str, value: object, problem: str) -> ConfigError:
        return ConfigError.one(where, field, str(value)[:80], problem)

    for field in ("engine_sha256", "onnx_sha256", "manifest_sha256"):
        if (field in report or field != "manifest_sha256") and not (
                isinstance(report.get(field), str) and _SHA256.fullmatch(report[field])):
            raise refuse(field, report.get(field), "must be 64 lowercase hex digits")
    for field in ("tensorrt", "gpu", "target"):
        if not _TEXT.fullmatch(report[field]):
            raise refuse(field, report[field], "must be one line of printable text, at most "
                                               "200 characters")
    if not _COMPUTE_CAPABILITY.fullmatch(report["compute_capability"]):
        raise refuse("compute_capability", report["compute_capability"], "must be sm_XY")
    precision = report["precision"]
    if precision not in PRECISION_TOLERANCE:
        raise refuse("precision", precision, f"must be one of {', '.join(PRECISION_TOLERANCE)}")
    if report["builder"] not in BUILDERS:
        raise refuse("builder", report["builder"], f"must be one of {', '.join(BUILDERS)}")
    if report["engine_bytes"] < 1:
        raise refuse("engine_bytes", report["engine_bytes"], "must be at least 1")
    if not math.isfinite(report["build_seconds"]) or report["build_seconds"] < 0:
        raise refuse("build_seconds", report["build_seconds"], "must be a finite number >= 0")
    if not math.isfinite(report["latency_budget_ms"]) or report["latency_budget_ms"] <= 0:
        raise refuse("latency_budget_ms", report["latency_budget_ms"],
                     "must be a finite number above 0")
    numbers: dict[str, float] = {}
    for field in ("max_abs_diff", "tolerance", "latency_p50_us", "latency_p99_us"):
        value = check[field]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (
                math.isnan(value) or (field != "max_abs_diff" and math.isinf(value))):
            raise refuse(f"check.{field}", value, "must be a finite number >= 0")
        numbers[field] = float(value)
    samples = check["samples"]
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise refuse("check.samples", samples, "must be a whole number >= 1")
    if not 0 < numbers["tolerance"] <= PRECISION_TOLERANCE[precision]:
        raise refuse("check.tolerance", numbers["tolerance"], f"must be above 0 and at most "
                                                              f"{PRECISION_TOLERANCE[precision]:g}"
                                                              f" for {precision} engines")
    if numbers["latency_p50_us"] > numbers["latency_p99_us"]:
        raise refuse("check.latency_p50_us", numbers["latency_p50_us"], "exceeds the p99")
    within = numbers["max_abs_diff"] <= numbers["tolerance"]
    if check["passed"] is not within:
        raise refuse("check.passed", check["passed"], f"must be {str(within).lower()}: max "
                                                      "abs diff vs tolerance")
    fast = numbers["latency_p99_us"] / 1000 <= report["latency_budget_ms"]
    if report["passed"] is not (within and fast):
        raise refuse("passed", report["passed"], f"must be {str(within and fast).lower()}: "
                                                 "the check and p99 vs latency budget")


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

    where = report_path or "engine report"
    check_engine_report(report, where)
    if bundle_digest:
        bundle_digest = check_bundle_digest(bundle_digest, where, "bundle digest")
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

    bundle_digest = check_bundle_digest(bundle_digest, "engine report", "bundle digest")
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

