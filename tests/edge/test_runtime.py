"""The on-robot runtime: bundle verification, provider choice and the fixed-rate loop on MuJoCo."""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import sys
import tarfile
import time
from hashlib import sha256
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import pytest
import torch

from edge import runtime
from edge.bundle import read_manifest, write_bundle
from edge.export import export_onnx
from edge.runtime import ControlLoop, LoadedPolicy, RuntimeRefusal, load_bundle

ARM_XML = """
<mujoco>
  <option timestep="0.005"/>
  <worldbody>
    <body name="upper">
      <joint name="shoulder" type="hinge" axis="0 0 1" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
      <body name="lower" pos="0.3 0 0">
        <joint name="elbow" type="hinge" axis="0 0 1" damping="0.1"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.025"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="shoulder" ctrlrange="-1 1" gear="1"/>
    <motor joint="elbow" ctrlrange="-1 1" gear="1"/>
  </actuator>
</mujoco>
"""
OBS_DIM, ACT_DIM = 4, 2
RATE_HZ = 200.0


class ArmRobot:
    """The 2-joint arm: ``read`` gives (qpos, qvel), ``apply`` sets ctrl and steps once."""

    def __init__(self) -> None:
        self.model = mujoco.MjModel.from_xml_string(ARM_XML)
        self.data = mujoco.MjData(self.model)
        self.applied: list[np.ndarray] = []

    def read(self) -> np.ndarray:
        return np.concatenate([self.data.qpos, self.data.qvel])

    def apply(self, action: np.ndarray) -> None:
        self.applied.append(action.copy())
        self.data.ctrl[:] = action
        mujoco.mj_step(self.model, self.data)


class FaultyArm(ArmRobot):
    """An arm whose ``read`` returns a bad observation on chosen steps."""

    def __init__(self, faults: dict[int, Any]) -> None:
        super().__init__()
        self.faults = faults
        self.reads = 0

    def read(self) -> np.ndarray:
        step, self.reads = self.reads, self.reads + 1
        return self.faults[step] if step in self.faults else super().read()


class SlowSession:
    """Wraps an ONNX Runtime session, sleeping ``delay_s`` on chosen calls."""

    def __init__(self, inner: Any, slow_calls: set[int], delay_s: float) -> None:
        self.inner, self.slow_calls, self.delay_s, self.calls = inner, slow_calls, delay_s, 0

    def run(self, *args: Any) -> Any:
        call, self.calls = self.calls, self.calls + 1
        if call in self.slow_calls:
            time.sleep(self.delay_s)
        return self.inner.run(*args)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle of a small normalised MLP (4 -> 2, tanh output), made as the package stage does."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(OBS_DIM, 32), torch.nn.ELU(), torch.nn.Linear(32, ACT_DIM), torch.nn.Tanh()
    )
    work = tmp_path_factory.mktemp("bundle")
    onnx_path = export_onnx(net, OBS_DIM, work / "policy.onnx")
    manifest = {
        "io": {
            "obs": {"name": "obs", "shape": ["batch", OBS_DIM], "dtype": "float32",
                    "names": ["q0", "q1", "qd0", "qd1"], "units": ["rad", "rad", "rad/s", "rad/s"]},
            "actions": {"name": "actions", "shape": ["batch", ACT_DIM], "dtype": "float32",
                        "names": ["tau0", "tau1"], "units": ["N m", "N m"], "range": [-0.5, 0.5]},
        },
        "control_hz": RATE_HZ,
        "latency_budget_ms": 1000.0 / RATE_HZ,
        "target": {"name": "test"},
    }
    write_bundle(work / "bundle.tar", {"policy.onnx": onnx_path}, manifest)
    return work / "bundle.tar"


@pytest.fixture(scope="module")
def loaded(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedPolicy:
    return load_bundle(bundle, tmp_path_factory.mktemp("run") / "policy", allow_unsigned=True)


def _rewrite(src: Path, dest: Path, edit: Any) -> Path:
    """Copy the tar ``src`` to ``dest`` member by member, through ``edit(name, data)``.

    ``edit`` returns a list of (TarInfo, data) to write in place of the member.
    """
    with tarfile.open(src) as tar, tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as out:
        for member in tar.getmembers():
            stream = tar.extractfile(member)
            data = stream.read() if stream else b""
            for info, payload in edit(member.name, data):
                out.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return dest


def _info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info


def test_loads_verified_bundle(loaded: LoadedPolicy) -> None:
    assert (loaded.obs_dim, loaded.act_dim) == (OBS_DIM, ACT_DIM)
    assert loaded.provider in runtime.PROVIDER_ORDER
    assert (loaded.workdir / "policy.onnx").is_file()
    assert (loaded.workdir / "manifest.json").is_file()
    assert loaded.control_hz == RATE_HZ
    assert loaded.infer(np.zeros(OBS_DIM, np.float32)).shape == (ACT_DIM,)


def _tampered(name: str, data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    if name == "policy.onnx":
        data = data[:-1] + bytes([data[-1] ^ 1])
    return [(_info(name, len(data)), data)]


def _extra(name: str, data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out: list[tuple[tarfile.TarInfo, bytes | None]] = [(_info(name, len(data)), data)]
    return [*out, (_info("extra.txt", 2), b"hi")] if name == "policy.onnx" else out


def _dotdot(name: str, data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out: list[tuple[tarfile.TarInfo, bytes | None]] = [(_info(name, len(data)), data)]
    return [(_info("../evil", 2), b"hi"), *out] if name == "policy.onnx" else out


def _symlink(name: str, data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    if name != "policy.onnx":
        return [(_info(name, len(data)), data)]
    link = _info(name, 0, tarfile.SYMTYPE)
    link.linkname = "/etc/passwd"
    return [(link, None)]


def _missing(name: str, data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    return [] if name == "policy.onnx" else [(_info(name, len(data)), data)]


@pytest.mark.parametrize(
    ("edit", "member", "words"),
    [
        (_tampered, "policy.onnx", "sha256"),
        (_extra, "extra.txt", "not listed"),
        (_dotdot, "../evil", "'..'"),
        (_symlink, "policy.onnx", "not a regular file"),
        (_missing, "policy.onnx", "missing"),
    ],
    ids=["tampered", "extra", "dotdot", "symlink", "missing"],
)
def test_refuses_bad_bundle(
    bundle: Path, tmp_path: Path, edit: Any, member: str, words: str
) -> None:
    bad = _rewrite(bundle, tmp_path / "bad.tar", edit)
    workdir = tmp_path / "work"
    with pytest.raises(RuntimeRefusal) as caught:
        load_bundle(bad, workdir, allow_unsigned=True)
    message = str(caught.value)
    assert "\n" not in message
    assert str(bad) in message and repr(member) in message and words in message
    assert list(workdir.iterdir()) == []
    assert not (tmp_path / "evil").exists()


def test_refuses_oversize_member(bundle: Path, tmp_path: Path) -> None:
    manifest = len(json.dumps(read_manifest(bundle), separators=(",", ":")))
    with pytest.raises(RuntimeRefusal, match=r"policy.onnx': [0-9]+ bytes exceeds the member cap"):
        load_bundle(bundle, tmp_path / "work", max_member_bytes=manifest + 1, allow_unsigned=True)


def test_provider_order() -> None:
    everything = ["CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"]
    assert runtime.choose_providers(everything) == list(runtime.PROVIDER_ORDER)
    assert runtime.choose_providers(["CUDAExecutionProvider"]) == [
        "CUDAExecutionProvider", "CPUExecutionProvider"
    ]
    assert runtime.choose_providers([]) == ["CPUExecutionProvider"]


def test_tensorrt_engine_needs_tensorrt(tmp_path: Path) -> None:
    if "tensorrt" in sys.modules or _importable("tensorrt"):
        pytest.skip("tensorrt is installed")
    with pytest.raises(RuntimeRefusal, match="tensorrt Python module is not importable"):
        engine = tmp_path / "policy.engine"
        engine.write_bytes(b"engine")
        runtime.load_tensorrt_engine(engine, sha256(b"engine").hexdigest())


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_loop_drives_mujoco_arm_on_time(loaded: LoadedPolicy) -> None:
    robot = ArmRobot()
    # A 20 ms period leaves a shared CI machine's scheduler room; rates are for the benchmark.
    stats = ControlLoop(loaded, robot, 50.0).run(50)
    assert stats.steps == 50 and len(robot.applied) == 50
    assert stats.deadline_misses <= 5
    assert stats.malformed_inputs == 0
    assert stats.inference_overruns <= stats.deadline_misses
    assert stats.safe_holds == stats.inference_overruns
    assert 0.95 <= stats.elapsed_s <= 1.0 + 0.2 * (1 + stats.skipped_periods)
    assert 0 < stats.latency_p50_us <= stats.latency_p99_us <= stats.latency_max_us
    applied = np.array(robot.applied)
    assert applied.min() >= -0.5 and applied.max() <= 0.5
    assert np.abs(robot.data.qpos).sum() > 0  # the arm moved


def test_malformed_observations_hold_safe_action(loaded: LoadedPolicy) -> None:
    faults = {
        5: np.full(OBS_DIM, np.nan),
        6: np.array([0.0, 0.0, np.inf, 0.0]),
        10: np.zeros(OBS_DIM + 1),
        15: np.zeros(OBS_DIM, np.int64),
        20: [0.0] * OBS_DIM,
    }
    robot = FaultyArm(faults)
    stats = ControlLoop(loaded, robot, 1000.0).run(30)
    assert stats.malformed_inputs == len(faults)
    assert stats.safe_holds == len(faults) + stats.inference_overruns
    assert stats.bad_outputs == 0
    for step in faults:
        if step - 1 not in faults:  # held action is the previous step's good action
            np.testing.assert_array_equal(robot.applied[step], robot.applied[step - 1])


def test_malformed_first_step_holds_zeros_or_given_safe_action(loaded: LoadedPolicy) -> None:
    robot = FaultyArm({0: np.full(OBS_DIM, np.nan)})
    ControlLoop(loaded, robot, 1000.0).run(2)
    np.testing.assert_array_equal(robot.applied[0], np.zeros(ACT_DIM))
    robot = FaultyArm({0: np.full(OBS_DIM, np.nan), 1: np.full(OBS_DIM, np.nan)})
    ControlLoop(loaded, robot, 1000.0, safe_action=np.array([2.0, -0.1])).run(2)
    np.testing.assert_array_equal(robot.applied[1], np.array([0.5, -0.1], np.float32))


def test_slow_inference_counts_deadline_misses(loaded: LoadedPolicy) -> None:
    slow = dataclasses.replace(loaded, session=SlowSession(loaded.session, {3, 7}, 0.008))
    robot = ArmRobot()
    stats = ControlLoop(slow, robot, RATE_HZ).run(12)
    assert stats.inference_overruns >= 2
    assert stats.deadline_misses >= stats.inference_overruns
    assert stats.safe_holds == stats.inference_overruns
    assert stats.latency_max_us >= 8000
    for step in (3, 7):
        np.testing.assert_array_equal(robot.applied[step], robot.applied[step - 1])


def test_runtime_imports_only_stdlib_numpy_and_its_backends_inside_functions() -> None:
    """The runtime ships alone: the standard library and numpy at import, and ONNX Runtime,
    TensorRT with cuda-python, and model-signing (given a trust key) only where used."""
    tree = ast.parse(Path(runtime.__file__).read_text())
    optional = {"onnxruntime", "tensorrt", "cuda", "model_signing"}
    allowed = set(sys.stdlib_module_names) | {"numpy"} | optional

    def imported(nodes: list[ast.stmt] | ast.AST) -> set[str]:
        found: set[str] = set()
        for node in nodes if isinstance(nodes, list) else ast.walk(nodes):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, "relative import"
                found.add((node.module or "").split(".")[0])
        return found

    everywhere = imported(tree)
    assert everywhere - {"__future__"} <= allowed, everywhere - allowed
    assert optional <= everywhere
    assert not imported(tree.body) & optional, "an optional backend is imported at load"


class NanSession:
    """A session whose every output is NaN."""

    def run(self, *args: Any) -> list[np.ndarray]:
        return [np.full((1, ACT_DIM), np.nan, np.float32)]


def test_non_finite_policy_output_holds_safe_action(loaded: LoadedPolicy) -> None:
    broken = dataclasses.replace(loaded, session=NanSession())
    robot = ArmRobot()
    stats = ControlLoop(broken, robot, 1000.0, safe_action=np.array([0.1, 0.2])).run(5)
    assert stats.bad_outputs + stats.inference_overruns == 5 == stats.safe_holds
    expected = np.tile(np.array([0.1, 0.2], np.float32), (5, 1))
    np.testing.assert_array_equal(np.array(robot.applied), expected)
