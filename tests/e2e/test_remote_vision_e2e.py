"""A policy that sees (a vision bundle), served over OpenPI's websocket protocol by
``flows policy serve``:
openpi-client sends OpenPI's observation keys with camera images and gets what ONNX Runtime
computes; ``flows validate ws://...`` renders the task's camera, sends it under the server's
keys (or the suite's and the command line's, with a prompt) and gives the local file's
per-episode outcomes on the same suite and seeds, with each call's latency."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from stages.sim.tasks.catalog import get_task
from tests.edge.test_vision_bundle import reach_vision_bundle
from tests.support import free_port

CliEnv = Callable[..., dict[str, str]]

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SUITE = FIXTURES / "reach_vision_suite_tiny.yaml"

pytestmark = pytest.mark.e2e


def flows(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_served_vision_policy_answers_openpi_client_and_validates_as_its_file(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    bundle = reach_vision_bundle(tmp_path)  # unsigned: --allow-unsigned below
    onnx_file = tmp_path / "policy.onnx"
    spec = get_task("reach-vision-v0")
    env = cli_env(tmp_path / ".physai", shared_prefect=False)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "flows.cli", "policy", "serve",
                               str(bundle), "--allow-unsigned", "--port", str(port)],
                              env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        assert "unsigned; running it unauthenticated" in line, line
        line = server.stderr.readline()
        assert f"on ws://127.0.0.1:{port}" in line, line
        assert "reads observation/state, observation/image (64x64x3)" in line, line

        openpi = WebsocketClientPolicy("127.0.0.1", port)
        meta = openpi.get_server_metadata()
        assert meta["keys"] == {"obs": "observation/state", "front_image": "observation/image"}
        assert meta["image_shapes"] == {"observation/image": [64, 64, 3]}
        rng = np.random.default_rng(0)
        obs = rng.normal(size=(8, spec.obs_dim)).astype(np.float32)
        images = rng.integers(0, 256, (8, 64, 64, 3), dtype=np.uint8)
        session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        expected = session.run(None, {"obs": obs, "front_image": images})[0]
        served = np.stack([openpi.infer({"observation/state": o, "observation/image": i,
                                         "prompt": "reach the red ball"})["actions"]
                           for o, i in zip(obs, images, strict=True)])
        assert np.abs(served - expected).max() <= 1e-5

        args = ("--suite", str(SUITE), "--json", "--min-success", "0")
        uri = f"ws://127.0.0.1:{port}"
        there = flows("validate", uri, *args, env=env, cwd=tmp_path)
        here = flows("validate", str(bundle), "--allow-unsigned", *args, env=env, cwd=tmp_path)
        assert there.returncode == 0 and here.returncode == 0, there.stderr + here.stderr
        remote_body, local = json.loads(there.stdout), json.loads(here.stdout)
        for far, near in zip(remote_body["scenes"], local["scenes"], strict=True):
            assert far["outcomes"] == near["outcomes"] and len(near["outcomes"]) == 6
            assert far["mean_return"] == pytest.approx(near["mean_return"], abs=1e-5)
        latency = remote_body["remote_latency_ms"]
        steps = yaml.safe_load((FIXTURES / "reach_vision_scene_tiny.yaml").read_text())[
            "episode_steps"]
        assert latency["calls"] == steps  # the 6 worlds of a step in one message
        assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
        print("remote vision latency (ms):", latency)

        # The suite's key map and prompt, and the command line's over them.
        keyed = yaml.safe_load(SUITE.read_text())
        keyed["scenes"][0]["scene"] = str(FIXTURES / keyed["scenes"][0]["scene"])
        keyed["remote"] = {"keys": {"front_image": "observation/image"},
                           "prompt": "reach the red ball"}
        (tmp_path / "keyed.yaml").write_text(yaml.safe_dump(keyed))
        told = flows("validate", uri, "--suite", "keyed.yaml", "--min-success", "0",
                     "--obs-key", "obs=observation/state", "--prompt", "touch the red ball",
                     env=env, cwd=tmp_path)
        assert told.returncode == 0, told.stderr
        assert f"remote policy: {steps} calls, p50 " in told.stdout, told.stdout
        (near,) = local["scenes"]
        assert f"{near['successes']}/6 = " in told.stdout, told.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_flows_validate_runs_a_remote_chunk_policy_as_the_command_line_says(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    import threading

    from stages.policies import policy_server, wire
    from tests.stages.test_remote_vision import ChunkSeer

    spec = get_task("reach-vision-v0")
    (camera,) = spec.cameras
    seer = ChunkSeer(spec.act_dim)
    meta = {"task": spec.name, "obs_dim": spec.obs_dim, "act_dim": spec.act_dim,
            "policy_digest": "seer", "chunk_size": 3, "keys": wire.default_keys(seer.inputs),
            "image_shapes": {"observation/image": list(camera.shape(camera.image_key))}}
    ready, stop, port = threading.Event(), threading.Event(), free_port()
    thread = threading.Thread(target=policy_server.serve, args=(seer, meta, "127.0.0.1", port),
                              kwargs={"ready": ready, "stop": stop}, daemon=True)
    thread.start()
    assert ready.wait(10)
    env = cli_env(tmp_path / ".physai", shared_prefect=False)
    try:
        runs = {how: flows("validate", f"ws://127.0.0.1:{port}", "--suite", str(SUITE),
                           "--json", "--min-success", "0", *how, env=env, cwd=tmp_path)
                for how in ((), ("--chunk-execute", "2"), ("--chunk-ensemble", "0.01"))}
    finally:
        stop.set()
        thread.join(timeout=10)
    calls = {}
    for how, done in runs.items():
        assert done.returncode == 0, done.stderr[-2000:]
        calls[how] = json.loads(done.stdout)["remote_latency_ms"]["calls"]
    steps = yaml.safe_load((FIXTURES / "reach_vision_scene_tiny.yaml").read_text())[
        "episode_steps"]
    assert calls == {(): steps / 3, ("--chunk-execute", "2"): steps / 2,
                     ("--chunk-ensemble", "0.01"): steps}
