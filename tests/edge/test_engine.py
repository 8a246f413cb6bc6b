"""The on-target engine build: calibration set, plan, commands, report and its MLflow record.

The TensorRT build itself runs only where TensorRT and a CUDA GPU exist; everything around it
is tested here.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge import engine
from edge.bundle import unpack_bundle
from edge.calibration import draw_calibration_set
from edge.engine import (
    EngineBuildError,
    EngineCheck,
    calibration_batches,
    engine_report,
    plan_build,
    trtexec_command,
)
from edge.polygraphy_check import polygraphy_command

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


@pytest.fixture
def unpacked(policy_bundle: Path, tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    unpack_bundle(policy_bundle, root)
    return root


def _edit_manifest(root: Path, **changes: Any) -> None:
    path = root / "manifest.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_calibration_set_is_a_seeded_ordered_subset(dataset_obs: np.ndarray) -> None:
    first = draw_calibration_set(dataset_obs, 100, seed=3)
    assert first.shape == (100, dataset_obs.shape[1]) and first.dtype == np.float32
    assert first.flags.c_contiguous
    np.testing.assert_array_equal(first, draw_calibration_set(dataset_obs, 100, seed=3))
    assert not np.array_equal(first, draw_calibration_set(dataset_obs, 100, seed=4))
    rows = [int(np.flatnonzero((dataset_obs == row).all(axis=1))[0]) for row in first]
    assert rows == sorted(rows) and len(set(rows)) == 100
    np.testing.assert_array_equal(draw_calibration_set(dataset_obs, 10_000), dataset_obs)


@pytest.mark.parametrize(
    ("obs", "samples", "fragment"),
    [
        (np.zeros((0, 3)), 4, "non-empty"),
        (np.zeros(5), 4, "non-empty"),
        (np.zeros((5, 3)), 0, "samples must be at least 1"),
        (np.array([[0.0, np.nan]]), 1, "NaN or inf"),
    ],
)
def test_calibration_set_refuses_bad_input(obs: np.ndarray, samples: int, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        draw_calibration_set(obs, samples)


def test_calibration_batches_cover_every_row_in_order(dataset_obs: np.ndarray) -> None:
    batches = list(calibration_batches(dataset_obs[:150], 64))
    assert [len(b["obs"]) for b in batches] == [64, 64, 22]
    np.testing.assert_array_equal(np.concatenate([b["obs"] for b in batches]), dataset_obs[:150])


def test_plan_reads_the_bundle(unpacked: Path, tmp_path: Path) -> None:
    plan = plan_build(unpacked, out_dir=tmp_path / "out")
    assert (plan.precision, plan.obs_dim, plan.act_dim) == ("fp16", 11, 3)
    assert plan.tolerance == engine.PRECISION_TOLERANCE["fp16"]
    assert plan.engine == tmp_path / "out" / "policy.fp16.engine"
    assert plan.target["gpu_arch"] == "sm_87" and plan.latency_budget_ms == 20.0
    assert np.load(plan.calibration).shape == (256, 11)
    assert not (tmp_path / "out").exists()  # planning writes nothing


def test_plan_takes_a_tighter_tolerance_from_the_manifest(unpacked: Path) -> None:
    _edit_manifest(unpacked, engine={"tolerances": {"int8": 0.05}, "calibration": {}})
    assert plan_build(unpacked, precision="int8").tolerance == 0.05


@pytest.mark.parametrize("value", [0.5, 1e9, -1.0, 0, "0.1", True])
def test_a_manifest_cannot_loosen_the_engine_tolerance(unpacked: Path, value: object) -> None:
    _edit_manifest(unpacked, engine={"tolerances": {"int8": value}, "calibration": {}})
    with pytest.raises(EngineBuildError, match=r"field 'engine.tolerances.int8'") as caught:
        plan_build(unpacked, precision="int8")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "manifest", "fragment"),
    [
        ({"precision": "fp8"}, {}, "precision must be one of"),
        ({"precision": "bf16"}, {}, "supports precisions fp32, fp16, int8 (value: 'bf16')"),
        ({}, {"opset": 21}, "parses opsets up to 20 (value: 21)"),
        ({"builder": "onnx2trt"}, {}, "builder must be one of python, trtexec"),
        ({"precision": "int8", "builder": "trtexec"}, {}, "needs this calibration cache"),
        ({}, {"io": {}}, "bad or missing field"),
        ({"max_batch": 0}, {}, "must be positive"),
    ],
)
def test_plan_refuses_what_the_target_cannot_build(
    unpacked: Path, kwargs: dict[str, Any], manifest: dict[str, Any], fragment: str
) -> None:
    if manifest:
        _edit_manifest(unpacked, **manifest)
    with pytest.raises(EngineBuildError) as caught:
        plan_build(unpacked, **kwargs)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_plan_refuses_a_missing_member(unpacked: Path) -> None:
    (unpacked / "calibration" / "obs.npy").unlink()
    with pytest.raises(EngineBuildError, match=r"'calibration/obs\.npy' missing"):
        plan_build(unpacked)
    with pytest.raises(EngineBuildError, match="not an unpacked bundle"):
        plan_build(unpacked / "calibration")


def test_trtexec_command(unpacked: Path) -> None:
    plan = plan_build(unpacked)
    assert trtexec_command(plan, "/usr/src/tensorrt/bin/trtexec") == [
        "/usr/src/tensorrt/bin/trtexec",
        f"--onnx={unpacked / 'policy.onnx'}",
        f"--saveEngine={unpacked / 'policy.fp16.engine'}",
        "--minShapes=obs:1x11",
        "--optShapes=obs:1x11",
        "--maxShapes=obs:64x11",
        "--memPoolSize=workspace:256M",
        f"--timingCacheFile={unpacked / 'timing.cache'}",
        "--skipInference",
        "--fp16",
    ]


def test_trtexec_int8_uses_the_calibration_cache(unpacked: Path) -> None:
    (unpacked / "calibration.cache").write_bytes(b"TRT-100300-EntropyCalibration2\n")
    plan = plan_build(unpacked, precision="int8", builder="trtexec")
    cmd = trtexec_command(plan)
    assert cmd[-3:] == ["--int8", "--fp16", f"--calib={unpacked / 'calibration.cache'}"]
    assert plan.engine.name == "policy.int8.engine"
    fp32 = trtexec_command(plan_build(unpacked, precision="fp32"))
    assert not any(flag in fp32 for flag in ("--fp16", "--int8", "--bf16"))


def test_polygraphy_command_compares_at_the_plan_tolerance(unpacked: Path) -> None:
    (unpacked / "calibration.cache").write_bytes(b"cache")
    plan = plan_build(unpacked, precision="int8")
    cmd = polygraphy_command(plan, unpacked / "inputs.json")
    assert cmd[:5] == ["polygraphy", "run", str(plan.onnx), "--trt", "--onnxrt"]
    text = shlex.join(cmd)
    assert "--trt-min-shapes 'obs:[1,11]'" in text and "--trt-max-shapes 'obs:[64,11]'" in text
    assert f"--atol {plan.tolerance:g} --rtol 0" in text
    assert text.endswith(f"--int8 --fp16 --calibration-cache {unpacked / 'calibration.cache'}")


def _report(plan: engine.BuildPlan, diff: float, p99_us: float) -> dict[str, Any]:
    check = EngineCheck(samples=256, max_abs_diff=diff, tolerance=plan.tolerance,
                        passed=diff <= plan.tolerance, latency_p50_us=p99_us / 2,
                        latency_p99_us=p99_us, latency_iters=100)
    return engine_report(plan, check, engine_sha256="cd" * 32, engine_bytes=123456,
                         tensorrt="10.3.0", gpu="Orin (nvgpu)", compute_capability="sm_87",
                         build_seconds=12.5, command=trtexec_command(plan))


def test_report_passes_only_within_tolerance_and_budget(unpacked: Path) -> None:
    plan = plan_build(unpacked)
    good = _report(plan, 1e-3, 300.0)
    assert good["passed"] and good["within_budget"]
    assert good["onnx_sha256"] == json.loads((unpacked / "manifest.json").read_text())[
        "files"]["policy.onnx"]["sha256"]
    assert good["lineage"]["mlflow_model_name"] == "test-policy"
    assert not _report(plan, 0.5, 300.0)["passed"]
    slow = _report(plan, 1e-3, 25_000.0)
    assert not slow["passed"] and not slow["within_budget"]
    json.dumps(good, allow_nan=False)


@pytest.mark.skipif(HAS_TENSORRT, reason="TensorRT is installed here")
def test_without_tensorrt_the_build_stops_in_one_line(unpacked: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(unpacked / "engine.py"), str(unpacked),
                           "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("error: TensorRT is not installed on this machine")
    assert len(done.stderr.strip().splitlines()) == 1 and "jetson" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(HAS_TENSORRT, reason="TensorRT is installed here")
def test_flows_engine_build_without_tensorrt_exits_two(
    policy_bundle: Path, tmp_path: Path
) -> None:
    done = subprocess.run([sys.executable, "-m", "flows.cli", "engine", "build",
                           str(policy_bundle), "--out", str(tmp_path / "out"),
                           "--allow-unsigned"],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    warning, error = done.stderr.strip().splitlines()
    assert warning.startswith("warning: ") and "unsigned" in warning
    assert "TensorRT is not installed" in error


@pytest.mark.skipif(not HAS_TENSORRT, reason="needs TensorRT and a CUDA GPU (the target)")
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_engine_builds_checks_and_times_on_tensorrt(
    unpacked: Path, tmp_path: Path, precision: str
) -> None:
    plan = plan_build(unpacked, precision=precision, out_dir=tmp_path / "out")
    report = engine.run(plan, any_gpu=True, iters=200)
    assert report["check"]["passed"], report["check"]
    assert plan.engine.is_file() and json.loads(plan.report.read_text()) == report
    assert report["tensorrt"] and report["compute_capability"].startswith("sm_")


def test_report_is_recorded_in_mlflow_as_an_external_model(
    unpacked: Path, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    from stages.tracking.engine_record import read_engine_report, record_engine
    from stages.tracking.lineage import LineageRecorder

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lineage = LineageRecorder(uri, tmp_path / "artifacts")
    client = MlflowClient(uri, registry_uri=uri)
    client.create_registered_model("test-policy")
    bundle_digest = "ef" * 32
    client.create_model_version("test-policy", str(tmp_path), tags={
        "physai.bundle.digest": bundle_digest})
    client.create_model_version("test-policy", str(tmp_path), tags={
        "physai.bundle.digest": "00" * 32})
    path = tmp_path / "engine_report.json"
    path.write_text(json.dumps(_report(plan_build(unpacked), 2e-3, 400.0)))
    run_id, model_id = record_engine(read_engine_report(path), lineage,
                                     bundle_digest=bundle_digest)

    model = client.get_logged_model(model_id)
    assert model.model_type == "tensorrt-engine" and model.source_run_id == run_id
    assert model.tags["physai.engine.sha256"] == "cd" * 32
    assert model.tags["physai.tensorrt"] == "10.3.0"
    assert model.tags["physai.bundle.digest"] == bundle_digest
    assert str(model.status) in ("READY", "LoggedModelStatus.READY")
    run = client.get_run(run_id)
    assert run.data.metrics["engine_latency_p99_us"] == 400.0
    assert run.data.metrics["engine_max_abs_diff"] == 2e-3
    assert run.data.params["gpu"] == "Orin (nvgpu)"
    assert {m.key for m in model.metrics or []} >= {"engine_latency_p99_us"}
    assert "engine_report.json" in {f.path for f in client.list_artifacts(run_id)}
    tagged, other = (client.get_model_version("test-policy", v) for v in ("1", "2"))
    assert tagged.tags["physai.engine.jetson-agx-orin.fp16"] == "cd" * 32
    assert "physai.engine.jetson-agx-orin.fp16" not in other.tags


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        ({"engine_sha256": None}, "engine_sha256: missing or of the wrong type"),
        ({"passed": "yes"}, "passed: missing or of the wrong type"),
        ({"format": 2}, "format: must be 1"),
        ({"check": {}}, "check.samples: missing"),
    ],
)
def test_bad_engine_report_names_the_field(
    unpacked: Path, tmp_path: Path, edit: dict[str, Any], fragment: str
) -> None:
    from physai_core.errors import ConfigError
    from stages.tracking.engine_record import read_engine_report

    path = tmp_path / "engine_report.json"
    path.write_text(json.dumps(_report(plan_build(unpacked), 1e-3, 300.0) | edit))
    with pytest.raises(ConfigError) as caught:
        read_engine_report(path)
    assert str(caught.value).startswith(f"{path}: ") and fragment in str(caught.value)
    assert caught.value.exit_code == 2
