"""The runtime's TensorRT path: :class:`edge.runtime.TensorRTPolicy` runs an engine that
``engine.py`` built, with the ONNX Runtime policy's ``infer``, inside the control loop.

The engine tests run where ``tensorrt`` and ``cuda-python`` import (the target, or a machine
with a CUDA GPU); everywhere else the refusal without them is tested.
"""

from __future__ import annotations

import importlib.util
import json
from hashlib import sha256
from pathlib import Path

import numpy as np
import pytest

from edge.bundle import unpack_bundle
from edge.runtime import ControlLoop, LoadedPolicy, RuntimeRefusal, TensorRTPolicy, load_bundle

HAS_TENSORRT = all(importlib.util.find_spec(m) is not None for m in ("tensorrt", "cuda"))


@pytest.fixture
def loaded(policy_bundle: Path, tmp_path: Path) -> LoadedPolicy:
    return load_bundle(policy_bundle, tmp_path / "run", providers=["CPUExecutionProvider"],
                       allow_unsigned=True)


def _engine(folder: Path, data: bytes, manifest_sha256: str, engine_sha256: str = "") -> Path:
    """An engine file and the report beside it, as ``engine.py`` leaves them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "policy.fp16.engine").write_bytes(data)
    report = {"manifest_sha256": manifest_sha256,
              "engine_sha256": engine_sha256 or sha256(data).hexdigest()}
    (folder / "engine_report.json").write_text(json.dumps(report))
    return folder / "policy.fp16.engine"


@pytest.mark.skipif(HAS_TENSORRT, reason="tests the refusal on a machine without TensorRT")
def test_without_tensorrt_the_engine_is_refused_in_one_line(
    loaded: LoadedPolicy, tmp_path: Path
) -> None:
    engine = _engine(tmp_path / "out", b"not an engine", loaded.manifest_sha256)
    with pytest.raises(RuntimeRefusal, match="tensorrt Python module is not importable") as err:
        TensorRTPolicy(loaded, engine)
    assert "\n" not in str(err.value) and "ONNX Runtime" in str(err.value)


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("no report", "engine report not found"),
        ("another bundle's report", "field 'manifest_sha256' names another bundle"),
        ("another engine", "is not the engine the bundle's engine report records"),
        ("bad digest", "field 'engine_sha256' must be 64 lowercase hex digits"),
    ],
)
def test_an_engine_runs_only_with_its_bundles_report(
    loaded: LoadedPolicy, tmp_path: Path, case: str, fragment: str
) -> None:
    manifest = loaded.manifest_sha256
    engine = _engine(tmp_path / "out", b"planted engine", "0" * 64 if case.startswith(
        "another bundle") else manifest, {"another engine": "ab" * 32,
                                          "bad digest": "' OR 1=1"}.get(case, ""))
    if case == "no report":
        (tmp_path / "out" / "engine_report.json").unlink()
    with pytest.raises(RuntimeRefusal, match=fragment) as err:
        TensorRTPolicy(loaded, engine)
    assert "\n" not in str(err.value)


class Replay:
    """A robot that plays back recorded observations and keeps every action it is given."""

    def __init__(self, obs: np.ndarray) -> None:
        self.obs, self.step, self.applied = obs, 0, []

    def read(self) -> np.ndarray:
        return self.obs[self.step % len(self.obs)]

    def apply(self, action: np.ndarray) -> None:
        self.applied.append(action.copy())
        self.step += 1


@pytest.mark.skipif(not HAS_TENSORRT, reason="needs TensorRT, cuda-python and a CUDA GPU")
def test_the_control_loop_runs_a_tensorrt_engine(
    loaded: LoadedPolicy, policy_bundle: Path, dataset_obs: np.ndarray, tmp_path: Path
) -> None:
    from edge import engine

    unpacked = tmp_path / "unpacked"
    unpack_bundle(policy_bundle, unpacked)
    plan = engine.plan_build(unpacked, precision="fp16", out_dir=tmp_path / "engine")
    report = engine.run(plan, any_gpu=True, iters=50)
    assert report["check"]["passed"], report["check"]
    policy = TensorRTPolicy(loaded, plan.engine)
    try:
        obs = dataset_obs[:64].astype(np.float32)
        got = np.stack([policy.infer(o) for o in obs])
        want = np.stack([loaded.infer(o) for o in obs])
        assert got.shape == (64, loaded.act_dim)
        assert np.abs(got - want).max() <= report["check"]["tolerance"]
        robot = Replay(obs)
        stats = ControlLoop(policy, robot, loaded.control_hz).run(100)
        assert stats.steps == 100 and len(robot.applied) == 100
        assert stats.safe_holds == 0
        np.testing.assert_allclose(robot.applied[0], np.clip(want[0], loaded.action_low,
                                                              loaded.action_high), atol=5e-2)
    finally:
        policy.close()


@pytest.mark.parametrize("engine", [False, True])
def test_flows_bundle_drive_refusals_are_one_line_exit_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: bool
) -> None:
    from flows.cli import main

    root = Path(__file__).resolve().parents[2]
    args = ["bundle", "drive", str(tmp_path / "missing.tar"), "--scene",
            str(root / "sim_scenes" / "reach" / "nominal.yaml"), "--episodes", "1"]
    if engine:
        args += ["--engine", str(tmp_path / "policy.engine")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("missing.tar: bundle file not found") and "\n" not in err
