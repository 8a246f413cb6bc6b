"""The robot side of a policy that sees: a bundle whose graph reads ``obs`` and camera images.

A tiny vision graph (one 3 x 3 convolution over a 16 x 16 frame, its mean per channel joined
with the normalized state) is exported here with the contract's I/O names, packed as the package
stage packs it, and run through every edge piece: session, manifest and verification, runtime
loop with a camera callable, latency at the real input sizes, calibration sets of images, the
TensorRT path's bindings (on a stand-in TensorRT where the real one does not import), and
``flows bundle drive`` on reach-vision-v0.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import types
import warnings
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edge.bench import onnx_latency, torch_latency
from edge.bundle import unpack_bundle, write_bundle
from edge.calibration import draw_calibration_set
from edge.engine import (
    calibration_arrays,
    calibration_batches,
    load_calibration,
    plan_build,
    trtexec_command,
)
from edge.errors import BundleError, EdgeError
from edge.manifest import check_bundle, validate_manifest
from edge.pack import pack_policy_bundle
from edge.polygraphy_check import polygraphy_command
from edge.runtime import ControlLoop, LoadedPolicy, RuntimeRefusal, TensorRTPolicy, load_bundle
from edge.session import open_session
from edge.targets import get_target
from edge.verify import check_parity, ood_inputs

OBS_DIM, ACT_DIM, SIZE = 5, 2, 16
IMAGE = "front_image"
FRAME = (SIZE, SIZE, 3)


class TinySeer(torch.nn.Module):
    """State and one camera frame to actions in [-1, 1]: normalizer, /255, one convolution,
    mean per channel, a linear layer and tanh. forward(obs (B, obs_dim) float32, image
    (B, H, W, 3) uint8) -> (B, act_dim)."""

    obs_mean: torch.Tensor
    obs_std: torch.Tensor

    def __init__(self, obs_dim: int = OBS_DIM, act_dim: int = ACT_DIM, image: str = IMAGE
                 ) -> None:
        super().__init__()
        self.inputs = ("obs", image)
        self.register_buffer("obs_mean", torch.linspace(-1.0, 1.0, obs_dim))
        self.register_buffer("obs_std", torch.linspace(0.5, 2.0, obs_dim))
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2)
        self.head = torch.nn.Linear(obs_dim + 4, act_dim)

    def forward(self, obs: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        pixels = image.permute(0, 3, 1, 2).float() / 255.0
        seen = torch.relu(self.conv(pixels)).mean(dim=(2, 3))
        state = (obs - self.obs_mean) / self.obs_std
        out: torch.Tensor = torch.tanh(self.head(torch.cat([state, 3.0 * seen], dim=1)))
        return out


def export_seer(module: torch.nn.Module, path: Path, obs_dim: int, frame: tuple[int, ...],
                image: str = IMAGE) -> Path:
    """``module`` as the contract's vision graph: obs FLOAT (batch, obs_dim), ``image`` UINT8
    (batch, H, W, 3) -> actions FLOAT (batch, act_dim), dynamic batch, opset 17."""
    example = (torch.zeros(2, obs_dim), torch.zeros((2, *frame), dtype=torch.uint8))
    module.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, str(path), input_names=["obs", image],
                          output_names=["actions"], opset_version=17, dynamo=False,
                          dynamic_axes={"obs": {0: "batch"}, image: {0: "batch"},
                                        "actions": {0: "batch"}})
    return path


def frames(n: int, seed: int = 0, frame: tuple[int, ...] = FRAME) -> np.ndarray:
    """``n`` random uint8 frames. Shape: (n, H, W, 3)."""
    return np.random.default_rng(seed).integers(0, 256, (n, *frame), dtype=np.uint8)


def image_entry(name: str = IMAGE, frame: tuple[int, ...] = FRAME) -> dict[str, Any]:
    """The manifest's ``io.images`` entry of one camera frame."""
    return {"name": name, "shape": ["batch", *frame], "dtype": "uint8", "layout": "HWC",
            "channels": "RGB", "camera": name.removesuffix("_image")}


@pytest.fixture(scope="module")
def seer() -> TinySeer:
    torch.manual_seed(0)
    return TinySeer()


@pytest.fixture(scope="module")
def seer_onnx(seer: TinySeer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_seer(seer, tmp_path_factory.mktemp("seer") / "policy.onnx", OBS_DIM, FRAME)


@pytest.fixture(scope="module")
def samples() -> dict[str, np.ndarray]:
    """Every input of 96 samples: states around the normalizer and random frames."""
    rng = np.random.default_rng(3)
    return {"obs": rng.standard_normal((96, OBS_DIM)).astype(np.float32), IMAGE: frames(96, 4)}


@pytest.fixture(scope="module")
def fields() -> dict[str, Any]:
    """The package stage's manifest fields for the tiny seer on Jetson AGX Orin."""
    from tests.support import policy_manifest_fields

    out = policy_manifest_fields([0.0] * OBS_DIM, [1.0] * OBS_DIM, ACT_DIM)
    out["io"]["images"] = [image_entry()]
    return out


@pytest.fixture(scope="module")
def vision_bundle(seer_onnx: Path, samples: dict[str, np.ndarray], fields: dict[str, Any],
                  tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vision") / "bundle.tar"
    pack_policy_bundle(out, seer_onnx, draw_calibration_set(samples, 64), "rendered frames",
                       fields, get_target("jetson-agx-orin"))
    return out


@pytest.fixture
def loaded(vision_bundle: Path, tmp_path: Path) -> LoadedPolicy:
    return load_bundle(vision_bundle, tmp_path / "run", providers=["CPUExecutionProvider"],
                       allow_unsigned=True)


# --------------------------------------------------------------------------- session, parity


def test_session_opens_a_graph_with_named_image_inputs(seer: TinySeer, seer_onnx: Path,
                                                       samples: dict[str, np.ndarray]) -> None:
    session = open_session(seer_onnx)
    assert (session.obs_dim, session.act_dim) == (OBS_DIM, ACT_DIM)
    assert dict(session.images) == {IMAGE: FRAME} and session.inputs == ("obs", IMAGE)
    got = session.run({IMAGE: samples[IMAGE][:8], "obs": samples["obs"][:8]})
    with torch.no_grad():
        want = seer(torch.from_numpy(samples["obs"][:8]), torch.from_numpy(samples[IMAGE][:8]))
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    with pytest.raises(EdgeError, match="pass them by name"):
        session.run(samples["obs"][:8])
    with pytest.raises(EdgeError, match=r"\['front_image'\] are missing"):
        session.run({"obs": samples["obs"][:8]})


def test_a_state_graph_opens_as_before(onnx_path: Path, obs_dim: int) -> None:
    session = open_session(onnx_path)
    assert session.obs_dim == obs_dim and dict(session.images) == {}
    assert session.inputs == ("obs",)
    assert session.run(np.zeros((3, obs_dim), np.float32)).shape[0] == 3


def test_an_image_input_must_be_uint8_hwc(tmp_path: Path) -> None:
    class FloatImage(TinySeer):
        def forward(self, obs: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
            return super().forward(obs, image.to(torch.uint8))

    path = tmp_path / "float.onnx"
    example = (torch.zeros(2, OBS_DIM), torch.zeros((2, *FRAME)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(FloatImage(), example, str(path), input_names=["obs", IMAGE],
                          output_names=["actions"], opset_version=17, dynamo=False)
    with pytest.raises(EdgeError, match="'front_image' must be tensor\\(uint8\\)"):
        open_session(path)


def test_parity_on_named_inputs_and_ood_frames(seer: TinySeer, seer_onnx: Path,
                                               samples: dict[str, np.ndarray]) -> None:
    report = check_parity(seer, seer_onnx, samples, tolerance=1e-5, batch_size=40)
    assert report.passed and report.samples == 96
    probes = ood_inputs(samples, 32, seed=1)
    assert probes["obs"].shape == (32, OBS_DIM) and probes[IMAGE].shape == (32, *FRAME)
    assert probes[IMAGE].dtype == np.uint8
    assert check_parity(seer, seer_onnx, probes, tolerance=1e-4).passed
    with pytest.raises(EdgeError, match="parity inputs lack"):
        check_parity(seer, seer_onnx, samples["obs"], tolerance=1e-5)
    bad = {"obs": samples["obs"], IMAGE: samples[IMAGE].astype(np.float32)}
    with pytest.raises(EdgeError, match="must be uint8 of shape"):
        check_parity(seer, seer_onnx, bad, tolerance=1e-5)


# --------------------------------------------------------------------------- manifest, verify


def test_the_manifest_names_each_image_input(vision_bundle: Path) -> None:
    manifest = check_bundle(vision_bundle)
    assert manifest["io"]["images"] == [image_entry()]
    calibration = manifest["engine"]["calibration"]
    assert calibration["inputs"] == {"obs": "calibration/obs.npy",
                                     IMAGE: "calibration/front_image.npy"}
    assert calibration["samples"] == 64
    assert "calibration/front_image.npy" in manifest["files"]


def test_a_state_manifest_keeps_its_form(policy_bundle: Path) -> None:
    manifest = check_bundle(policy_bundle)
    assert "images" not in manifest["io"]
    assert "inputs" not in manifest["engine"]["calibration"]


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda m: m["io"]["images"][0].update(dtype="float32"), "field 'io.images.0.dtype'"),
        (lambda m: m["io"]["images"][0].update(layout="CHW"), "field 'io.images.0.layout'"),
        (lambda m: m["io"]["images"][0].update(shape=["batch", 16, 16, 4]),
         "field 'io.images.0.shape.3'"),
        (lambda m: m["io"]["images"][0].pop("camera"), "'camera' is a required property"),
        (lambda m: m["io"].update(images=[]), "field 'io.images'"),
    ],
)
def test_the_schema_refuses_a_bad_image_entry(fields: dict[str, Any],
                                              edit: Callable[[dict[str, Any]], Any],
                                              fragment: str) -> None:
    manifest = json.loads(json.dumps(fields))
    manifest |= {"format_version": 1, "files": {"policy.onnx": {"sha256": "0" * 64, "bytes": 1}},
                 "engine": {"tolerances": {}, "calibration": {"member": "calibration/obs.npy",
                                                             "samples": 1, "source": "x"}}}
    validate_manifest(manifest, "m.json")
    edit(manifest)
    with pytest.raises(BundleError, match=fragment):
        validate_manifest(manifest, "m.json")


def test_verify_checks_the_graph_inputs_against_the_manifest(
    seer_onnx: Path, samples: dict[str, np.ndarray], fields: dict[str, Any], tmp_path: Path
) -> None:
    target = get_target("jetson-agx-orin")
    calibration = draw_calibration_set(samples, 16)

    def refused(name: str, manifest: dict[str, Any], data: Any = calibration) -> str:
        out = tmp_path / f"{name}.tar"
        pack_policy_bundle(out, seer_onnx, data, "frames", manifest, target)
        with pytest.raises(BundleError) as err:
            check_bundle(out)
        assert "\n" not in str(err.value)
        return str(err.value)

    smaller = copy.deepcopy(fields)
    smaller["io"]["images"] = [image_entry(frame=(8, 8, 3))]
    assert "input front_image is UINT8 [None, 16, 16, 3], not the manifest's" in refused(
        "smaller", smaller, {"obs": samples["obs"][:16], IMAGE: frames(16, frame=(8, 8, 3))})
    state_only = copy.deepcopy(fields)
    del state_only["io"]["images"]
    assert "graph I/O must be obs -> actions" in refused("state", state_only, samples["obs"])
    renamed = copy.deepcopy(fields)
    renamed["io"]["images"][0]["camera"] = "wrist"
    assert "must be its camera's image 'wrist_image'" in refused("renamed", renamed)
    assert "'engine.calibration.inputs' must list obs and every image input" in refused(
        "no frames", fields, samples["obs"][:16])


# --------------------------------------------------------------------------- runtime


def test_the_runtime_opens_a_vision_bundle_and_infers_by_name(
    loaded: LoadedPolicy, seer_onnx: Path, samples: dict[str, np.ndarray]
) -> None:
    assert loaded.images == {IMAGE: FRAME}
    session = open_session(seer_onnx)
    for i in range(4):
        got = loaded.infer(samples["obs"][i], {IMAGE: samples[IMAGE][i]})
        want = session.run({"obs": samples["obs"][i:i + 1], IMAGE: samples[IMAGE][i:i + 1]})
        np.testing.assert_allclose(got, want[0], atol=1e-6)
    with pytest.raises(ValueError, match=r"missing: \['front_image'\]"):
        loaded.infer(samples["obs"][0])


def test_the_runtime_refuses_a_graph_the_manifest_does_not_describe(
    seer_onnx: Path, tmp_path: Path
) -> None:
    io: dict[str, Any] = {"obs": {"shape": ["batch", OBS_DIM]},
                          "actions": {"shape": ["batch", ACT_DIM], "range": [-1.0, 1.0]}}
    cases = {
        "no images": ([], "graph I/O must be obs -> 'actions'"),
        "other size": ([image_entry(frame=(8, 8, 3))],
                       "graph input 'front_image' is tensor(uint8)"),
        "bad layout": ([image_entry() | {"layout": "CHW"}],
                       "must be uint8, layout HWC, channels RGB"),
    }
    for name, (images, fragment) in cases.items():
        tar = tmp_path / f"{name.replace(' ', '-')}.tar"
        manifest = {"io": io | ({"images": images} if images else {}), "control_hz": 50.0}
        write_bundle(tar, {"policy.onnx": seer_onnx}, manifest)
        with pytest.raises(RuntimeRefusal, match=re.escape(fragment)) as err:
            load_bundle(tar, tmp_path / name.replace(" ", "-"), allow_unsigned=True,
                        providers=["CPUExecutionProvider"])
        assert "\n" not in str(err.value)
        assert not any((tmp_path / name.replace(" ", "-")).iterdir())


class Recorder:
    """A robot that reads fixed states and keeps every action, with a camera callable that
    gives planted frames (or faults) per step."""

    def __init__(self, obs: np.ndarray, images: np.ndarray, faults: dict[int, Any]) -> None:
        self.obs, self.images, self.faults = obs, images, faults
        self.applied: list[np.ndarray] = []
        self.calls = 0

    def read(self) -> np.ndarray:
        return self.obs[len(self.applied) % len(self.obs)]

    def cameras(self) -> Any:
        step, self.calls = len(self.applied), self.calls + 1
        if step in self.faults:
            return self.faults[step]
        return {IMAGE: self.images[step % len(self.images)], "wrist_image": "not read"}

    def apply(self, action: np.ndarray) -> None:
        self.applied.append(action.copy())


def test_the_loop_passes_camera_frames_by_name(
    loaded: LoadedPolicy, samples: dict[str, np.ndarray]
) -> None:
    bad = {3: {IMAGE: samples[IMAGE][0].astype(np.float32)}, 5: {}, 7: {IMAGE: samples[IMAGE][:2]},
           9: None}
    robot = Recorder(samples["obs"][:12], samples[IMAGE][:12], bad)
    stats = ControlLoop(loaded, robot, 500.0, cameras=robot.cameras).run(12)
    assert robot.calls == 12 and len(robot.applied) == 12
    assert stats.malformed_inputs == len(bad)
    assert stats.safe_holds == len(bad) + stats.inference_overruns
    for step in range(12):
        if step in bad:
            np.testing.assert_array_equal(robot.applied[step], robot.applied[step - 1])
        elif step - 1 not in bad and stats.inference_overruns == 0:
            want = loaded.infer(samples["obs"][step], {IMAGE: samples[IMAGE][step]})
            np.testing.assert_allclose(robot.applied[step], np.clip(want, -1.0, 1.0), atol=1e-6)
    with pytest.raises(ValueError, match="pass cameras="):
        ControlLoop(loaded, robot, 500.0)


def test_a_slow_camera_counts_against_the_deadline(
    loaded: LoadedPolicy, samples: dict[str, np.ndarray]
) -> None:
    import time

    robot = Recorder(samples["obs"][:4], samples[IMAGE][:4], {})

    def slow() -> Any:
        if len(robot.applied) in (2, 4):
            time.sleep(0.012)
        return robot.cameras()

    stats = ControlLoop(loaded, robot, 200.0, cameras=slow).run(6)
    assert stats.deadline_misses >= 2 and stats.malformed_inputs == 0


# --------------------------------------------------------------------------- latency


def test_latency_is_timed_at_the_real_input_sizes(seer: TinySeer, seer_onnx: Path) -> None:
    report = onnx_latency(seer_onnx, OBS_DIM, iters=50, warmup=5, images={IMAGE: FRAME})
    assert report.images == {IMAGE: FRAME} and report.iters == 50
    assert 0 < report.p50_us <= report.p99_us
    assert report.inputs() == "obs + front_image 16x16x3 uint8"
    eager = torch_latency(seer, OBS_DIM, iters=20, warmup=2, images={IMAGE: FRAME})
    assert eager.images == {IMAGE: FRAME} and eager.p50_us > 0
    with pytest.raises(EdgeError, match="model takes images"):
        onnx_latency(seer_onnx, OBS_DIM, iters=1, images={IMAGE: (8, 8, 3)})


# --------------------------------------------------------------------------- calibration, engine


def test_calibration_sets_hold_images(samples: dict[str, np.ndarray]) -> None:
    drawn = draw_calibration_set(samples, 40, seed=2)
    state = draw_calibration_set(samples["obs"], 40, seed=2)
    np.testing.assert_array_equal(drawn["obs"], state)
    rows = [int(np.flatnonzero((samples["obs"] == row).all(axis=1))[0]) for row in state]
    np.testing.assert_array_equal(drawn[IMAGE], samples[IMAGE][rows])
    assert drawn[IMAGE].dtype == np.uint8
    batches = list(calibration_batches(drawn, 16))
    assert [len(b["obs"]) for b in batches] == [16, 16, 8]
    assert all(sorted(b) == ["front_image", "obs"] and b[IMAGE].dtype == np.uint8
               and b["obs"].dtype == np.float32 for b in batches)
    np.testing.assert_array_equal(np.concatenate([b[IMAGE] for b in batches]), drawn[IMAGE])
    with pytest.raises(ValueError, match="must be a camera image"):
        calibration_arrays({"obs": samples["obs"], IMAGE: samples[IMAGE].astype(np.float32)})
    with pytest.raises(ValueError, match="as many samples each"):
        calibration_arrays({"obs": samples["obs"], IMAGE: samples[IMAGE][:3]})
    with pytest.raises(ValueError, match="must hold 'obs'"):
        calibration_arrays({IMAGE: samples[IMAGE]})


def test_the_engine_plan_binds_every_input_by_name(vision_bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "bundle"
    unpack_bundle(vision_bundle, root)
    plan = plan_build(root, precision="int8")
    assert plan.images == {IMAGE: FRAME}
    assert plan.calibration_inputs == {"obs": root / "calibration/obs.npy",
                                       IMAGE: root / "calibration/front_image.npy"}
    inputs = load_calibration(plan)
    assert inputs[IMAGE].shape == (64, *FRAME) and inputs[IMAGE].dtype == np.uint8
    cmd = trtexec_command(plan)
    assert f"--minShapes=obs:1x{OBS_DIM},front_image:1x16x16x3" in cmd
    assert f"--maxShapes=obs:64x{OBS_DIM},front_image:64x16x16x3" in cmd
    poly = polygraphy_command(plan, tmp_path / "inputs.json")
    at = poly.index("--trt-max-shapes")
    assert poly[at + 1:at + 3] == [f"obs:[64,{OBS_DIM}]", "front_image:[64,16,16,3]"]
    (root / "calibration" / "front_image.npy").unlink()
    with pytest.raises(Exception, match=r"'calibration/front_image\.npy' missing"):
        plan_build(root)


class FakeCuda:
    """cuda-python's runtime calls the TensorRT path makes, on host memory."""

    class cudaMemcpyKind:
        cudaMemcpyHostToDevice = "h2d"
        cudaMemcpyDeviceToHost = "d2h"

    def __init__(self) -> None:
        self.memory: dict[int, np.ndarray] = {}
        self.freed: list[int] = []

    def cudaMalloc(self, nbytes: int) -> tuple[int, int]:
        block = np.zeros(nbytes, np.uint8)
        self.memory[block.ctypes.data] = block
        return 0, block.ctypes.data

    def cudaMemcpyAsync(self, dst: int, src: int, nbytes: int, kind: str, stream: Any
                        ) -> tuple[int]:
        import ctypes

        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def cudaStreamCreate(self) -> tuple[int, int]:
        return 0, 1

    def cudaStreamSynchronize(self, stream: Any) -> tuple[int]:
        return (0,)

    def cudaFree(self, pointer: int) -> tuple[int]:
        self.freed.append(pointer)
        return (0,)

    def cudaStreamDestroy(self, stream: Any) -> tuple[int]:
        return (0,)


class FakeEngine:
    """A deserialized engine whose execution runs the ONNX graph on the bound buffers."""

    def __init__(self, session: Any, cuda: FakeCuda, uint8_images: bool = True) -> None:
        self.session, self.cuda = session, cuda
        self.names = ["obs", IMAGE, "actions"]
        self.num_io_tensors = 3
        self.uint8_images = uint8_images

    def get_tensor_name(self, i: int) -> str:
        return self.names[i]

    def get_tensor_dtype(self, name: str) -> str:
        return "UINT8" if self.uint8_images else "FLOAT"

    def create_execution_context(self) -> Any:
        engine = self

        class Context:
            def __init__(self) -> None:
                self.shapes: dict[str, tuple[int, ...]] = {}
                self.addresses: dict[str, int] = {}

            def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
                self.shapes[name] = tuple(shape)
                return True

            def get_tensor_shape(self, name: str) -> tuple[int, ...]:
                return (1, ACT_DIM)

            def set_tensor_address(self, name: str, address: int) -> bool:
                self.addresses[name] = address
                return True

            def execute_async_v3(self, stream: int) -> bool:
                memory = engine.cuda.memory
                obs = memory[self.addresses["obs"]].view(np.float32).reshape(self.shapes["obs"])
                image = memory[self.addresses[IMAGE]].reshape(self.shapes[IMAGE])
                out = engine.session.run(["actions"], {"obs": obs, IMAGE: image})[0]
                memory[self.addresses["actions"]][:] = out.astype(np.float32).view(np.uint8)
                return True

        return Context()


def _fake_tensorrt(monkeypatch: pytest.MonkeyPatch, engine: FakeEngine, cuda: FakeCuda) -> None:
    from edge import runtime

    class Runtime:
        def __init__(self, logger: Any) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> FakeEngine:
            return engine

    class Logger:
        WARNING = 2

        def __init__(self, level: int) -> None:
            pass

    fake = types.SimpleNamespace(Runtime=Runtime, Logger=Logger,
                                 DataType=types.SimpleNamespace(UINT8="UINT8"))
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(runtime, "_cudart", lambda: cuda)


def _engine_file(folder: Path, loaded: LoadedPolicy) -> Path:
    folder.mkdir()
    data = b"stand-in engine"
    (folder / "policy.fp16.engine").write_bytes(data)
    (folder / "engine_report.json").write_text(json.dumps(
        {"manifest_sha256": loaded.manifest_sha256, "engine_sha256": sha256(data).hexdigest()}))
    return folder / "policy.fp16.engine"


def test_the_tensorrt_path_binds_uint8_frames_by_name(
    loaded: LoadedPolicy, samples: dict[str, np.ndarray], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = FakeCuda()
    _fake_tensorrt(monkeypatch, FakeEngine(loaded.session, cuda), cuda)
    policy = TensorRTPolicy(loaded, _engine_file(tmp_path / "engine", loaded))
    try:
        assert policy.images == {IMAGE: FRAME}
        for i in range(3):
            frame = {IMAGE: samples[IMAGE][i]}
            np.testing.assert_allclose(policy.infer(samples["obs"][i], frame),
                                       loaded.infer(samples["obs"][i], frame), atol=1e-6)
        robot = Recorder(samples["obs"][:5], samples[IMAGE][:5], {})
        stats = ControlLoop(policy, robot, 500.0, cameras=robot.cameras).run(5)
        assert stats.malformed_inputs == 0 and len(robot.applied) == 5
    finally:
        policy.close()
    assert len(cuda.freed) == 3


def test_the_tensorrt_path_refuses_an_engine_without_uint8_frames(
    loaded: LoadedPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = FakeCuda()
    _fake_tensorrt(monkeypatch, FakeEngine(loaded.session, cuda, uint8_images=False), cuda)
    with pytest.raises(RuntimeRefusal, match="engine input front_image must be UINT8"):
        TensorRTPolicy(loaded, _engine_file(tmp_path / "engine", loaded))
    engine = FakeEngine(loaded.session, cuda)
    engine.names, engine.num_io_tensors = ["obs", "actions"], 2
    _fake_tensorrt(monkeypatch, engine, cuda)
    with pytest.raises(RuntimeRefusal, match=r"engine I/O must be obs \+ front_image -> actions"):
        TensorRTPolicy(loaded, _engine_file(tmp_path / "engine2", loaded))


# --------------------------------------------------------------------------- drive


def reach_vision_bundle(folder: Path) -> Path:
    """A tiny seer of reach-vision-v0's inputs (17 states, the front camera's 64 x 64 frame),
    packed unsigned for the drive."""
    from stages.sim.tasks.catalog import get_task
    from tests.support import policy_manifest_fields

    spec = get_task("reach-vision-v0")
    camera = spec.cameras[0]
    frame = camera.shape(camera.image_key)
    torch.manual_seed(1)
    module = TinySeer(spec.obs_dim, spec.act_dim, camera.image_key)
    onnx_path = export_seer(module, folder / "policy.onnx", spec.obs_dim, frame,
                            camera.image_key)
    fields = policy_manifest_fields([0.0] * spec.obs_dim, [1.0] * spec.obs_dim, spec.act_dim,
                                    task=spec.name)
    fields["io"]["images"] = [image_entry(camera.image_key, frame)]
    fields["control_hz"], fields["latency_budget_ms"] = 25.0, 40.0
    data = {"obs": np.zeros((4, spec.obs_dim), np.float32),
            camera.image_key: frames(4, frame=frame)}
    out = folder / "reach-vision.tar"
    pack_policy_bundle(out, onnx_path, data, "frames", fields, get_target("jetson-agx-orin"))
    return out


def test_bundle_drive_renders_the_cameras_the_policy_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.cli import main
    from stages.evaluation import robot
    driven: list[Any] = []
    drive = robot.drive_bundle

    def recorded(*args: Any, **kwargs: Any) -> Any:
        driven.append(drive(*args, **kwargs))
        return driven[-1]

    monkeypatch.setattr(robot, "drive_bundle", recorded)
    root = Path(__file__).resolve().parents[2]
    bundle = reach_vision_bundle(tmp_path)
    code = main(["bundle", "drive", str(bundle), "--scene",
                 str(root / "sim_scenes" / "reach_vision" / "nominal.yaml"), "--episodes", "1",
                 "--allow-unsigned"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "nominal: " in out and "/1 = " in out and "100 steps" in out
    (result,) = driven
    # Every step's frame was rendered at the policy's size and read: no malformed input, and
    # an inference timed on each step (late ones too, on a busy machine).
    assert result.steps == 100 and result.malformed_inputs == 0
    assert result.latency_p50_us > 0


def test_bundle_drive_refuses_frames_of_another_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stages.evaluation.robot import SimRobot, drive_bundle
    from stages.sim.suites.loading import load_scene

    root = Path(__file__).resolve().parents[2]
    bundle = reach_vision_bundle(tmp_path)
    scene = load_scene(root / "sim_scenes" / "reach_vision" / "nominal.yaml")
    rendered = SimRobot.frames
    monkeypatch.setattr(SimRobot, "frames", lambda self: {
        name: frame[:8, :8] for name, frame in rendered(self).items()})
    with pytest.raises(RuntimeRefusal, match="reads front_image 64x64x3, the task's cameras "
                                             "render front_image 8x8x3") as err:
        drive_bundle(bundle, scene, 1, allow_unsigned=True)
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- package stage


class Seeing:
    """A stored policy that sees, as :func:`stages.policies.local.load_actor` gives it: ``inputs``
    and ``act(mapping) -> actions``, run by ONNX Runtime."""

    def __init__(self, onnx_path: Path, name: str = IMAGE) -> None:
        self.session = open_session(onnx_path)
        self.inputs = ("obs", name)
        self.seen: list[dict[str, tuple[int, ...]]] = []

    def __call__(self, observation: Any) -> np.ndarray:
        self.seen.append({k: (v.shape, v.dtype.name) for k, v in observation.items()})
        return self.session.run(dict(observation))


def test_the_package_stage_names_the_images_a_policy_reads(tmp_path: Path) -> None:
    from stages.sim.tasks.catalog import get_task
    from stages.steps.package import _manifest, image_inputs
    from tests.support import policy_manifest_fields

    spec = get_task("reach-vision-v0")
    bundle = reach_vision_bundle(tmp_path)
    act = Seeing(tmp_path / "policy.onnx", "front_image")
    images = image_inputs(spec, act)
    assert images == {"front_image": (64, 64, 3)}
    assert image_inputs(spec, lambda obs: obs) == {}
    with pytest.raises(Exception, match="the policy reads wrist_image; a bundle carries"):
        image_inputs(spec, types.SimpleNamespace(inputs=("obs", "wrist_image")))
    template = policy_manifest_fields([0.0] * spec.obs_dim, [1.0] * spec.obs_dim, spec.act_dim)
    cfg = types.SimpleNamespace(control_hz=25.0, precision="fp16")
    manifest = _manifest(cfg, spec, get_target("jetson-agx-orin"), 17,  # type: ignore[arg-type]
                         template["normalization"], images, template["parity"],
                         template["lineage"])
    assert manifest["io"]["images"] == [image_entry("front_image", (64, 64, 3))]
    state = _manifest(cfg, get_task("reach-v0"), get_target("jetson-agx-orin"),  # type: ignore[arg-type]
                      17, template["normalization"], {}, template["parity"], template["lineage"])
    assert "images" not in state["io"]
    assert check_bundle(bundle)["io"]["images"] == manifest["io"]["images"]


def test_given_parity_feeds_a_seeing_policy_by_name(seer_onnx: Path,
                                                    samples: dict[str, np.ndarray]) -> None:
    from stages.steps.package import given_parity

    act = Seeing(seer_onnx)
    report = given_parity(act, seer_onnx, samples, 1e-6)
    assert report.passed and report.samples == 96 and report.max_abs_diff == 0.0
    assert act.seen == [{"obs": ((96, OBS_DIM), "float32"), IMAGE: ((96, *FRAME), "uint8")}]


def test_rollout_inputs_hold_the_frames_the_task_rendered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.catalog import get_task
    from stages.steps import package

    root = Path(__file__).resolve().parents[2]
    reach_vision_bundle(tmp_path)
    act = Seeing(tmp_path / "policy.onnx", "front_image")
    monkeypatch.setattr(package, "load_actor", lambda path: act)
    monkeypatch.setattr(package, "SEEING_PARITY_WORLDS", 2)
    scene = load_scene(root / "sim_scenes" / "reach_vision" / "nominal.yaml")
    where = package.ParityScene("mujoco", scene, 7, None)
    ctx = types.SimpleNamespace(store=types.SimpleNamespace(open_payload=lambda p: p))
    policy = types.SimpleNamespace(task=get_task("reach-vision-v0").name)
    inputs = package.rollout_inputs(policy, ctx, where)  # type: ignore[arg-type]
    steps = scene.config.episode_steps
    assert inputs["obs"].shape == (2 * steps, 17) and inputs["obs"].dtype == np.float32
    assert inputs["front_image"].shape == (2 * steps, 64, 64, 3)
    assert inputs["front_image"].dtype == np.uint8
    assert len(act.seen) == steps - 1 and act.seen[0]["front_image"] == ((2, 64, 64, 3), "uint8")
    # rendered frames, not blank ones: the scene differs between pixels and steps
    assert inputs["front_image"].std() > 5
    assert not np.array_equal(inputs["front_image"][0], inputs["front_image"][-1])
    calibration = draw_calibration_set(inputs, 50)
    assert calibration["front_image"].shape == (50, 64, 64, 3)
