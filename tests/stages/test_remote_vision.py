"""Policies that see, over OpenPI's websocket protocol: openpi-client's own client gets ONNX
Runtime's actions from a served vision policy for OpenPI's observation keys and images; the
remote policy client sends the task's cameras under the server's key map, checks image sizes
before the first call, talks to an OpenPI-style server one observation a message, and takes
chunks of actions back."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from edge.export import export_onnx
from stages.policies import policy_server, remote, wire
from stages.policies.local import SeeingPolicy, onnx_actor
from stages.policies.vision import build_vision_policy
from tests.support import free_port

OBS_DIM, ACT_DIM = 5, 2
CAMERAS = {"front_image": (16, 16, 3), "wrist_image": (16, 12, 3)}


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    module = build_vision_policy(OBS_DIM, ACT_DIM, (32,), list(CAMERAS.items()),
                                 np.zeros(OBS_DIM, np.float32), np.ones(OBS_DIM, np.float32),
                                 encoder_channels=(8, 8))
    return export_onnx(module, OBS_DIM, tmp_path_factory.mktemp("vision") / "p.onnx",
                       images=CAMERAS)


def observation(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, OBS_DIM)).astype(np.float32),
            **{k: rng.integers(0, 256, (n, *s), dtype=np.uint8) for k, s in CAMERAS.items()}}


def metadata(**extra: Any) -> dict[str, Any]:
    shapes = {key: list(CAMERAS[name]) for name, key in
              wire.default_keys(("obs", *CAMERAS)).items() if name != "obs"}
    return {"task": "toy-vision", "obs_dim": OBS_DIM, "act_dim": ACT_DIM,
            "policy_digest": "toy", "keys": wire.default_keys(("obs", *CAMERAS)),
            "image_shapes": shapes, **extra}


@pytest.fixture
def serving() -> Iterator[Callable[..., int]]:
    stops: list[tuple[threading.Event, threading.Thread]] = []

    def start(act: Any, meta: dict[str, Any], **limits: Any) -> int:
        ready, stop, port = threading.Event(), threading.Event(), free_port()
        thread = threading.Thread(target=policy_server.serve, args=(act, meta, "127.0.0.1", port),
                                  kwargs={"ready": ready, "stop": stop,
                                          "limits": policy_server.ServerLimits(**limits)},
                                  daemon=True)
        thread.start()
        assert ready.wait(10)
        stops.append((stop, thread))
        return port

    yield start
    for stop, thread in stops:
        stop.set()
        thread.join(timeout=10)


def test_default_keys_are_openpis_and_the_state_alone_stays_obs() -> None:
    assert wire.default_keys(("obs",)) == {"obs": "obs"}
    assert wire.default_keys(("obs", "front_image", "wrist_image", "side_image")) == {
        "obs": "observation/state", "front_image": "observation/image",
        "wrist_image": "observation/wrist_image", "side_image": "observation/side_image"}
    assert wire.default_keys(("obs", "wrist_image", "top_image")) == {
        "obs": "observation/state", "wrist_image": "observation/wrist_image",
        "top_image": "observation/image"}
    with pytest.raises(ValueError, match="names side_image, which is not among the inputs"):
        wire.key_map(("obs", "front_image"), {"side_image": "x"})
    with pytest.raises(ValueError, match="two inputs under observation/image"):
        wire.key_map(("obs", "front_image"), {"obs": "observation/image"})


def test_openpi_client_gets_onnx_runtimes_actions_from_a_served_vision_policy(
    onnx_file: Path, serving: Callable[..., int]
) -> None:
    act = onnx_actor(onnx_file)
    assert isinstance(act, SeeingPolicy)
    port = serving(act, metadata())
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    seen = observation(8, seed=1)
    expected = session.run(None, seen)[0]
    client = WebsocketClientPolicy("127.0.0.1", port)
    meta = client.get_server_metadata()
    assert meta["image_shapes"] == {"observation/image": [16, 16, 3],
                                    "observation/wrist_image": [16, 12, 3]}
    for i in range(8):
        answer = client.infer({"observation/state": seen["obs"][i],
                               "observation/image": seen["front_image"][i],
                               "observation/wrist_image": seen["wrist_image"][i],
                               "prompt": "reach the red ball"})
        assert answer["actions"].shape == (ACT_DIM,)
        assert np.abs(answer["actions"] - expected[i]).max() <= 1e-5
    batch = client.infer({"observation/state": seen["obs"], "observation/image":
                          seen["front_image"], "observation/wrist_image": seen["wrist_image"]})
    assert batch["actions"].shape == (8, ACT_DIM)
    assert np.abs(batch["actions"] - expected).max() <= 1e-5
    # The inputs' own names are read too.
    own = client.infer({k: v[0] for k, v in seen.items()})["actions"]
    assert np.abs(own - expected[0]).max() <= 1e-5


def test_the_server_names_a_missing_key_and_a_wrong_image(
    onnx_file: Path, serving: Callable[..., int]
) -> None:
    port = serving(onnx_actor(onnx_file), metadata())
    client = WebsocketClientPolicy("127.0.0.1", port)
    one = {k: v[0] for k, v in observation(1).items()}
    message = {"observation/state": one["obs"], "observation/image": one["front_image"]}
    with pytest.raises(RuntimeError, match=r"no 'observation/wrist_image' \(the policy's "
                       r"wrist_image\) in the message"):
        client.infer(message)
    message["observation/wrist_image"] = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(RuntimeError, match=r"observation/wrist_image must have shape "
                       r"\(16, 12, 3\) or \(N, 16, 12, 3\), got \(32, 32, 3\)"):
        client.infer(message)
    message["observation/wrist_image"] = one["wrist_image"].astype(np.float32)
    with pytest.raises(RuntimeError, match="observation/wrist_image must be uint8 images"):
        client.infer(message)
    message["observation/wrist_image"] = one["wrist_image"]
    assert client.infer(message)["actions"].shape == (ACT_DIM,)


def test_a_served_vision_policys_frame_cap_counts_its_images(
    onnx_file: Path, serving: Callable[..., int]
) -> None:
    limits = policy_server.ServerLimits(max_batch=4)
    assert limits.max_frame_bytes(OBS_DIM, 16 * 16 * 3 + 16 * 12 * 3) == \
        4 * (OBS_DIM * 8 + 16 * 16 * 3 + 16 * 12 * 3) + wire.FRAME_OVERHEAD_BYTES
    with pytest.raises(ValueError, match=r"no image_shapes\['observation/image'\]"):
        policy_server.served_shapes({"obs_dim": OBS_DIM}, ("obs", "front_image"))


def test_the_client_sends_the_tasks_cameras_under_the_servers_keys_and_times_each_call(
    onnx_file: Path, serving: Callable[..., int]
) -> None:
    keys = {"obs": "state", "front_image": "cam/front", "wrist_image": "cam/wrist"}
    shapes = {"cam/front": [16, 16, 3], "cam/wrist": [16, 12, 3]}
    act = onnx_actor(onnx_file)
    assert isinstance(act, SeeingPolicy)
    port = serving(act, metadata(keys=keys, image_shapes=shapes, max_batch=3))
    client = remote.RemotePolicy(f"ws://127.0.0.1:{port}", OBS_DIM, ACT_DIM)
    assert client.inputs == ("obs",) and client.chunk_size is None and client.batched
    client.send_as(CAMERAS, prompt="reach the red ball")
    assert client.inputs == ("obs", "front_image", "wrist_image") and client.keys == keys
    seen = observation(7, seed=3)
    got = client(seen)
    assert got.shape == (7, ACT_DIM) and not client.failures
    assert np.abs(got - act(seen)).max() <= 1e-6
    summary = client.latency_summary()
    assert summary["calls"] == 3  # 7 worlds in messages of the server's max_batch of 3
    assert 0 < summary["p50_ms"] <= summary["max_ms"]
    client.close()


def test_image_sizes_are_checked_before_the_first_call(
    onnx_file: Path, serving: Callable[..., int]
) -> None:
    port = serving(onnx_actor(onnx_file), metadata())
    uri = f"ws://127.0.0.1:{port}"
    client = remote.RemotePolicy(uri, OBS_DIM, ACT_DIM)
    with pytest.raises(remote.RemotePolicyError) as wrong:
        client.send_as({"front_image": (64, 64, 3), "wrist_image": (16, 12, 3)})
    assert str(wrong.value) == (f"remote policy {uri}: observation/image: the server expects "
                                "16x16x3 images, the task's front_image is 64x64x3")
    with pytest.raises(remote.RemotePolicyError, match="the server reads "
                       r"observation/wrist_image \(16x12x3 images\), which no input is sent as"):
        client.send_as({"front_image": (16, 16, 3)})
    with pytest.raises(remote.RemotePolicyError, match="names side_image"):
        client.send_as(CAMERAS, keys={"side_image": "observation/side"})
    client.close()


class OpenPIStyle:
    """A server as OpenPI's ``serve_policy.py`` runs one: empty metadata, one observation a
    message, a chunk of actions and ``server_timing`` back, the traceback as a text frame and
    the connection closed on an error."""

    def __init__(self, chunk: int, metadata: dict[str, Any] | None = None) -> None:
        from websockets.sync.server import serve

        self.chunk, self.messages = chunk, []  # type: ignore[var-annotated]
        self.port = free_port()
        self.meta = metadata or {}
        self.server = serve(self.handle, "127.0.0.1", self.port, compression=None,
                            max_size=None)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, conn: Any) -> None:
        conn.send(wire.packb(self.meta))
        for frame in conn:
            message = wire.unpackb(frame)
            self.messages.append(message)
            try:
                image = message["observation/image"]
                if image.shape != (16, 16, 3):
                    raise ValueError(f"expected a (16, 16, 3) image, got {image.shape}")
                state = message["observation/state"]
                actions = np.stack([state[:ACT_DIM] + i for i in range(self.chunk)])
                conn.send(wire.packb({"actions": actions.astype(np.float32),
                                        "server_timing": {"infer_ms": 0.1}}))
            except Exception:
                conn.send(traceback.format_exc())
                conn.close(1011, "Internal server error. Traceback included in previous frame.")
                return

    def close(self) -> None:
        self.server.shutdown()


def test_an_openpi_style_server_gets_one_observation_a_message_and_chunks_come_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen = observation(3, seed=4)
    stated = OpenPIStyle(chunk=4, metadata={"chunk_size": 4})
    try:
        client = remote.RemotePolicy(f"ws://127.0.0.1:{stated.port}", OBS_DIM, ACT_DIM)
        client.send_as({"front_image": (16, 16, 3)}, prompt="reach the red ball")
        assert not client.batched and client.chunk_size == 4
        chunks = client({"obs": seen["obs"], "front_image": seen["front_image"]})
        assert chunks.shape == (3, 4, ACT_DIM) and not client.failures
        for i in range(4):
            np.testing.assert_allclose(chunks[:, i], seen["obs"][:, :ACT_DIM] + i)
        first = stated.messages[0]
        assert set(first) == {"observation/state", "observation/image", "prompt"}
        assert first["observation/image"].shape == (16, 16, 3)
        assert first["prompt"] == "reach the red ball"
        assert client.latency_summary()["calls"] == 3
        client.close()
    finally:
        stated.close()
    unstated = OpenPIStyle(chunk=4)
    try:
        client = remote.RemotePolicy(f"ws://127.0.0.1:{unstated.port}", OBS_DIM, ACT_DIM)
        client.send_as({"front_image": (16, 16, 3)})
        actions = client({"obs": seen["obs"], "front_image": seen["front_image"]})
        assert actions.shape == (3, ACT_DIM)
        np.testing.assert_allclose(actions, seen["obs"][:, :ACT_DIM])
        assert any("states no chunk_size" in r.getMessage() for r in caplog.records)
        client.close()
    finally:
        unstated.close()


def test_a_first_call_the_server_refuses_stops_the_run_naming_what_was_sent() -> None:
    server = OpenPIStyle(chunk=1)
    uri = f"ws://127.0.0.1:{server.port}"
    try:
        client = remote.RemotePolicy(uri, OBS_DIM, ACT_DIM)
        client.send_as({"front_image": (64, 64, 3)})
        big = {"obs": np.zeros((2, OBS_DIM), np.float32),
               "front_image": np.zeros((2, 64, 64, 3), np.uint8)}
        with pytest.raises(remote.RemotePolicyError) as refused:
            client(big)
        line = str(refused.value)
        assert "\n" not in line
        assert line.startswith(f"remote policy {uri}: the first call failed (server error: "
                               "ValueError: expected a (16, 16, 3) image, got (64, 64, 3))")
        assert line.endswith("it sent observation/state float32 (5,), "
                             "observation/image uint8 (64, 64, 3)")
    finally:
        server.close()


def test_a_served_chunk_policy_answers_chunks_and_the_client_says_its_size(
    serving: Callable[..., int]
) -> None:
    def chunked(obs: np.ndarray) -> np.ndarray:
        return np.stack([obs[:, :ACT_DIM] * (i + 1) for i in range(3)], axis=1)

    port = serving(chunked, {"task": "toy", "obs_dim": OBS_DIM, "act_dim": ACT_DIM,
                             "policy_digest": "toy", "chunk_size": 3})
    obs = np.arange(2 * OBS_DIM, dtype=np.float32).reshape(2, OBS_DIM)
    one = WebsocketClientPolicy("127.0.0.1", port).infer({"obs": obs[0]})["actions"]
    assert one.shape == (3, ACT_DIM)
    client = remote.RemotePolicy(f"ws://127.0.0.1:{port}", OBS_DIM, ACT_DIM)
    assert client.chunk_size == 3
    got = client(obs)
    assert got.shape == (2, 3, ACT_DIM) and np.array_equal(got, chunked(obs))
    client.close()


def test_a_slow_first_call_fails_its_episodes_and_the_rollout_goes_on(
    serving: Callable[..., int]
) -> None:
    calls = {"n": 0}

    def slow_first(obs: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] == 1:
            time.sleep(0.6)
        return obs[:, :ACT_DIM]

    port = serving(slow_first, {"obs_dim": OBS_DIM, "act_dim": ACT_DIM})
    client = remote.RemotePolicy(f"ws://127.0.0.1:{port}", OBS_DIM, ACT_DIM, timeout_s=0.3)
    obs = np.ones((2, OBS_DIM), np.float32)
    assert np.array_equal(client(obs), np.zeros((2, ACT_DIM), np.float32))
    assert client.failures == {0: "remote policy: no answer in 0.3 s",
                               1: "remote policy: no answer in 0.3 s"}
    assert np.array_equal(client(obs), obs[:, :ACT_DIM])
    client.close()


def test_a_suites_key_map_names_the_tasks_inputs(tmp_path: Path) -> None:
    import yaml

    from physai_core.errors import ConfigError
    from stages.sim.suites.loading import load_suite

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    suite = yaml.safe_load((fixtures / "reach_vision_suite_tiny.yaml").read_text())
    suite["scenes"][0]["scene"] = str(fixtures / suite["scenes"][0]["scene"])
    suite["remote"] = {"keys": {"front_image": "observation/image"}, "prompt": "reach"}
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(suite))
    remote_inputs = load_suite(tmp_path / "ok.yaml").config.remote
    assert remote_inputs is not None and remote_inputs.prompt == "reach"
    suite["remote"] = {"keys": {"side_image": "observation/image"}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(suite))
    with pytest.raises(ConfigError, match=r"remote\.keys\.side_image.*names no input of task "
                       "'reach-vision-v0'; its inputs: obs, front_image"):
        load_suite(tmp_path / "bad.yaml")


class ChunkSeer:
    """A policy that sees and emits chunks of 3 actions: toward the image's mean colour,
    shifted by the state."""

    inputs = ("obs", "front_image")
    chunk_size = 3

    def __init__(self, act_dim: int) -> None:
        self.act_dim = act_dim

    def __call__(self, observation: Any) -> np.ndarray:
        image = observation["front_image"].reshape(len(observation["obs"]), -1)
        base = np.tanh(image.mean(axis=1, keepdims=True) / 64.0 - 1.0
                       + observation["obs"][:, :1])
        steps = np.linspace(0.5, 1.0, self.chunk_size, dtype=np.float32)
        return np.repeat(base[:, None, :] * steps[None, :, None], self.act_dim,
                         axis=2).astype(np.float32)


def test_a_remote_chunk_policy_runs_as_validate_chunk_says_with_its_local_outcomes(
    serving: Callable[..., int]
) -> None:
    from stages.evaluation.suite import evaluate_suite
    from stages.sections.models import ChunkConfig, ValidateConfig
    from stages.sim.suites.loading import load_suite
    from stages.sim.tasks.catalog import get_task

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    suite = load_suite(fixtures / "reach_vision_suite_tiny.yaml")
    spec = get_task("reach-vision-v0")
    (camera,) = spec.cameras
    seer = ChunkSeer(spec.act_dim)
    shape = list(camera.shape(camera.image_key))
    port = serving(seer, {"task": spec.name, "obs_dim": spec.obs_dim, "act_dim": spec.act_dim,
                          "policy_digest": "seer", "chunk_size": 3,
                          "keys": wire.default_keys(seer.inputs),
                          "image_shapes": {"observation/image": shape}})
    client = remote.RemotePolicy(f"ws://127.0.0.1:{port}", spec.obs_dim, spec.act_dim)
    client.send_as({camera.image_key: tuple(shape)})
    gates = ValidateConfig(suite=str(suite.path), min_success=0.0,
                           chunk=ChunkConfig(execute=2))
    far = evaluate_suite(suite, client, gates=gates)
    near = evaluate_suite(suite, seer, gates=gates)
    assert [s.outcomes for s in far] == [s.outcomes for s in near]
    assert [s.mean_return for s in far] == pytest.approx([s.mean_return for s in near],
                                                          abs=1e-5)
    steps = suite.scenes[0].scene.config.episode_steps
    assert client.latency_summary()["calls"] == -(-steps // 2)  # one query per 2 steps
    client.close()


def test_flows_policy_serve_states_its_keys_image_shapes_and_chunk_size() -> None:
    from flows.serve_cli import _metadata
    from physai_core.errors import ConfigError
    from stages.sim.tasks.catalog import get_task
    from stages.training.policy_reference import ResolvedPolicy

    spec = get_task("reach-vision-v0")
    seer = ResolvedPolicy(ChunkSeer(spec.act_dim), "ab" * 32, "bundle")
    meta = _metadata(spec, seer)
    assert meta["keys"] == {"obs": "observation/state", "front_image": "observation/image"}
    assert meta["image_shapes"] == {"observation/image": [64, 64, 3]}
    assert meta["chunk_size"] == 3 and meta["server"] == "physai-flows"
    keyed = _metadata(spec, seer, [("front_image", "image"), ("obs", "state")])
    assert keyed["keys"] == {"obs": "state", "front_image": "image"}
    assert keyed["image_shapes"] == {"image": [64, 64, 3]}
    with pytest.raises(ConfigError, match=r"--obs-key.*names wrist_image"):
        _metadata(spec, seer, [("wrist_image", "image")])
    state = ResolvedPolicy(lambda obs: obs, "cd" * 32, "store")
    assert _metadata(spec, state)["keys"] == {"obs": "obs"}
    assert "image_shapes" not in _metadata(spec, state)
