"""Policies that see: build, npz round trip, ONNX export and parity on uint8 frames, the
random-shift augmentation, and cloning an action only the image tells."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from edge.errors import EdgeError
from edge.export import export_onnx
from physai_core.errors import ConfigError, PhysaiError
from stages.core.hashing import sha256_file
from stages.datasets.demonstrations import Transitions
from stages.policies.local import SeeingPolicy, load_actor, load_policy, policy_fn, save_policy
from stages.policies.vision import (
    SpatialSoftmax,
    VisionPolicy,
    build_vision_policy,
    random_shift,
    vision_meta,
)
from stages.sections.models import TrainConfig
from stages.steps.train import train_more

OBS_DIM = 5
ACT_DIM = 2
SIZE = 16
CAMERAS = [("front_image", (SIZE, SIZE, 3)), ("wrist_image", (SIZE, 12, 3))]


def make(cameras: list[tuple[str, tuple[int, int, int]]] = CAMERAS) -> VisionPolicy:
    torch.manual_seed(0)
    mean = np.arange(OBS_DIM, dtype=np.float32)
    return build_vision_policy(OBS_DIM, ACT_DIM, (32,), cameras, mean,
                               np.full(OBS_DIM, 2.0, np.float32), encoder_channels=(8, 8))


def observation(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, OBS_DIM)).astype(np.float32),
            **{key: rng.integers(0, 256, (n, *shape), dtype=np.uint8) for key, shape in CAMERAS}}


def test_forward_reads_state_then_each_image() -> None:
    module = make()
    assert module.inputs == ("obs", "front_image", "wrist_image")
    act = policy_fn(module)
    assert isinstance(act, SeeingPolicy) and act.inputs == module.inputs
    actions = act(observation(7))
    assert actions.shape == (7, ACT_DIM) and actions.dtype == np.float32
    assert np.abs(actions).max() <= 1.0
    seen = observation(7)
    seen["front_image"] = 255 - seen["front_image"]
    assert not np.allclose(act(seen), actions)


def test_the_policy_refuses_what_it_does_not_read() -> None:
    act = policy_fn(make())
    obs = observation(3)
    with pytest.raises(PhysaiError, match="lacks wrist_image"):
        act({k: v for k, v in obs.items() if k != "wrist_image"})
    with pytest.raises(PhysaiError, match="must be uint8"):
        act({**obs, "front_image": obs["front_image"].astype(np.float32)})
    with pytest.raises(PhysaiError, match="not one array"):
        act(obs["obs"])


def test_too_small_an_image_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 4 pixels"):
        make([("front_image", (3, 16, 3))])
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        make([("front_image", (16, 16, 1))])


def test_npz_round_trip_is_bit_identical(tmp_path: Path) -> None:
    module = make()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.01 * torch.randn_like(p))
    meta = {**vision_meta(module), "task": "reach-vision-v0"}
    assert meta["kind"] == "vision"
    assert meta["cameras"] == [{"key": "front_image", "shape": [SIZE, SIZE, 3]},
                               {"key": "wrist_image", "shape": [SIZE, 12, 3]}]
    save_policy(module, tmp_path / "p.npz", meta)
    loaded, loaded_meta = load_policy(tmp_path / "p.npz")
    assert loaded_meta == meta
    obs = observation(16)
    np.testing.assert_array_equal(policy_fn(module)(obs), policy_fn(loaded)(obs))
    actor = load_actor(tmp_path / "p.npz")
    assert actor.inputs == ("obs", "front_image", "wrist_image")  # type: ignore[attr-defined]
    np.testing.assert_array_equal(actor(obs), policy_fn(module)(obs))  # type: ignore[arg-type]
    save_policy(loaded, tmp_path / "again.npz", loaded_meta)
    assert sha256_file(tmp_path / "p.npz") == sha256_file(tmp_path / "again.npz")
    with np.load(tmp_path / "p.npz", allow_pickle=False) as blob:
        assert all(blob[k].dtype != object for k in blob.files)


def test_unknown_kind_is_a_config_error(tmp_path: Path) -> None:
    module = make()
    save_policy(module, tmp_path / "p.npz", {**vision_meta(module), "kind": "diffusion"})
    with pytest.raises(ConfigError, match="unknown policy kind 'diffusion'"):
        load_policy(tmp_path / "p.npz")


def test_onnx_export_names_uint8_images_and_matches_torch(tmp_path: Path) -> None:
    module = make()
    path = export_onnx(module, OBS_DIM, tmp_path / "p.onnx", images=dict(CAMERAS))
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    signature = [(v.name, onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type),
                  [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
                 for v in (*model.graph.input, *model.graph.output)]
    assert signature == [("obs", "FLOAT", ["batch", OBS_DIM]),
                         ("front_image", "UINT8", ["batch", SIZE, SIZE, 3]),
                         ("wrist_image", "UINT8", ["batch", SIZE, 12, 3]),
                         ("actions", "FLOAT", ["batch", ACT_DIM])]
    actor = load_actor(path)
    assert isinstance(actor, SeeingPolicy)
    assert actor.inputs == ("obs", "front_image", "wrist_image")
    for n in (1, 5, 64):
        obs = observation(n, seed=n)
        np.testing.assert_allclose(actor(obs), policy_fn(module)(obs), rtol=1e-5, atol=1e-6)


def test_export_refuses_a_bad_image_and_keeps_the_state_signature(tmp_path: Path) -> None:
    with pytest.raises(EdgeError, match=r"shaped \(H, W, 3\)"):
        export_onnx(make(), OBS_DIM, tmp_path / "p.onnx",
                    images={"front_image": (SIZE, SIZE)})  # type: ignore[dict-item]
    with pytest.raises(EdgeError, match="policy forward failed"):
        export_onnx(make(), OBS_DIM, tmp_path / "p.onnx", images={"front_image": CAMERAS[0][1]})
    assert not (tmp_path / "p.onnx").exists()


def test_spatial_softmax_gives_each_channels_position() -> None:
    features = torch.full((1, 2, 4, 5), -50.0)
    features[0, 0, 0, 4] = 50.0  # top right
    features[0, 1, 3, 0] = 50.0  # bottom left
    keypoints = SpatialSoftmax(4, 5)(features)
    torch.testing.assert_close(keypoints, torch.tensor([[1.0, -1.0, -1.0, 1.0]]))


def test_random_shift_moves_each_frame_within_the_bound() -> None:
    height, width, shift = 10, 12, 3
    rows = torch.arange(height)[:, None].expand(height, width)
    cols = torch.arange(width)[None, :].expand(height, width)
    frames = torch.stack([rows, cols], -1).to(torch.uint8)[None].repeat(64, 1, 1, 1)
    torch.manual_seed(0)
    moved = random_shift(frames, shift)
    assert moved.shape == frames.shape and moved.dtype == torch.uint8
    assert random_shift(frames, 0) is frames
    offsets = set()
    for frame in moved.long():
        dy = int(frame[height // 2, 0, 0]) - height // 2
        dx = int(frame[0, width // 2, 1]) - width // 2
        assert abs(dy) <= shift and abs(dx) <= shift
        expected_rows = (torch.arange(height) + dy).clamp(0, height - 1)
        expected_cols = (torch.arange(width) + dx).clamp(0, width - 1)
        assert torch.equal(frame[:, 0, 0], expected_rows)
        assert torch.equal(frame[0, :, 1], expected_cols)
        offsets.add((dy, dx))
    assert len(offsets) > 20


def squares(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frames with one bright 3 x 3 square on a dark, noisy ground, and the actions it sets:
    its column and row, scaled to [-0.8, 0.8]. Shapes: (n, 16, 16, 3), (n, 2), (n, 1)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 40, (n, SIZE, SIZE, 3), dtype=np.uint8)
    corner = rng.integers(0, SIZE - 2, (n, 2))
    for frame, (r, c) in zip(frames, corner, strict=True):
        frame[r : r + 3, c : c + 3] = (230, 220, 60)
    actions = (0.8 * (2.0 * corner[:, ::-1] / (SIZE - 3) - 1.0)).astype(np.float32)
    return frames, actions, rng.normal(size=(n, 1)).astype(np.float32)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Train on one torch thread: beside other busy processes, torch's spinning workers slow a
    small network several times over."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def clone_squares(module: torch.nn.Module) -> tuple[float, float]:
    """Train ``module`` on :func:`squares` frames; its action MSE on new frames and the
    variance of their actions."""
    frames, actions, obs = squares(1200, seed=1)
    data = Transitions(obs, actions, np.arange(len(obs)) // 20, {"front_image": frames})
    cfg = TrainConfig(epochs=10, batch_size=64, lr=3e-3, image_shift=1)
    curve = train_more(module, data, cfg, cfg.epochs, seed=0)
    assert len(curve) == cfg.epochs and curve[-1][0] < curve[0][0]
    test_frames, test_actions, test_obs = squares(400, seed=2)
    predicted = policy_fn(module)({"obs": test_obs, "front_image": test_frames})
    return float(np.mean((predicted - test_actions) ** 2)), float(np.var(test_actions))


def test_cloning_learns_what_only_the_image_shows(one_thread: None) -> None:
    torch.manual_seed(0)
    module = build_vision_policy(1, ACT_DIM, (64, 64), [("front_image", (SIZE, SIZE, 3))],
                                 np.zeros(1, np.float32), np.ones(1, np.float32), (16, 16))
    mse, variance = clone_squares(module)
    assert mse < 0.1 * variance, (mse, variance)
