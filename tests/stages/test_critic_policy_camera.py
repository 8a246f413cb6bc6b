"""``validate.critic.camera``: the Cosmos critic watches what a policy that sees was shown of
its episodes (the frames of its camera, the filmed worlds side by side) instead of the filmed
video; tested against the local stand-in of a Cosmos Reason NIM (tests/cosmos_standin.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stages.evaluation import critic
from stages.evaluation.reporting import critique
from stages.evaluation.rollout import VideoSpec, rollout
from stages.policies.local import policy_fn
from stages.policies.vision import build_vision_policy
from stages.sections.models import CriticConfig
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task
from tests.cosmos_standin import StandIn, serve_in_thread

pytest.importorskip("av")

ROOT = Path(__file__).resolve().parents[2]
SCENE = ROOT / "tests" / "fixtures" / "reach_vision_scene_tiny.yaml"
FILMED = [np.full((24, 66, 3), 10 * i, np.uint8) for i in range(7)]
SEEN = {"front_image": np.stack([np.full((2, 16, 16, 3), 30 * i, np.uint8) for i in range(4)]),
        "wrist_image": np.zeros((4, 2, 8, 8, 3), np.uint8)}


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "requests.jsonl"
    server: StandIn
    server, url = serve_in_thread("pass", log)
    yield url, log
    server.shutdown()
    server.server_close()


def test_the_critic_watches_the_video_the_policys_first_camera_or_a_named_one() -> None:
    frames, camera = critic.watched(CriticConfig(), "nominal", FILMED, SEEN)
    assert camera is None and frames == FILMED
    frames, camera = critic.watched(CriticConfig(camera="policy"), "nominal", FILMED, SEEN)
    assert camera == "front" and len(frames) == 4
    assert all(f.shape == (16, 32, 3) for f in frames)  # the two filmed worlds side by side
    assert [int(f[0, 0, 0]) for f in frames] == [0, 30, 60, 90]
    for name in ("wrist", "wrist_image"):
        frames, camera = critic.watched(CriticConfig(camera=name), "nominal", FILMED, SEEN)
        assert camera == "wrist" and frames[0].shape == (8, 16, 3)


def test_a_camera_the_policy_does_not_read_is_one_line() -> None:
    with pytest.raises(critic.CriticError) as side:
        critic.watched(CriticConfig(camera="side"), "nominal", FILMED, SEEN)
    assert str(side.value) == ("validate.critic.camera: side: scene 'nominal': not a camera "
                               "the policy reads (it reads front_image, wrist_image)")
    with pytest.raises(critic.CriticError, match="the policy was shown no camera image"):
        critic.watched(CriticConfig(camera="policy"), "nominal", FILMED, None)
    with pytest.raises(critic.CriticError, match="has no video to judge"):
        critic.watched(CriticConfig(), "nominal", [], SEEN)


def test_the_critic_is_sent_the_frames_a_seeing_policy_saw_in_its_rollout(
    standin: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, log = standin
    spec = get_task("reach-vision-v0")
    (camera,) = spec.cameras
    torch.manual_seed(0)
    shape = camera.shape(camera.image_key)
    act = policy_fn(build_vision_policy(spec.obs_dim, spec.act_dim, (8,),
                                        [(camera.image_key, shape)],
                                        np.zeros(spec.obs_dim, np.float32),
                                        np.ones(spec.obs_dim, np.float32),
                                        encoder_channels=(4, 4)))
    env = spec.make_env(load_scene(SCENE), 3, 0)
    video = VideoSpec(episodes=2, width=48, height=40, every=4, camera=spec.camera)
    out = rollout(env, act, video)
    assert out.seen is not None and out.frames
    sent: list[list[np.ndarray]] = []
    prompts: list[str] = []
    encode, judge = critic.encode_mp4, critic.judge

    def recorded(frames: list[np.ndarray], fps: float) -> bytes:
        sent.append(list(frames))
        return encode(frames, fps)

    def asked(ep: Any, scene: str, clip: bytes, prompt: str) -> Any:
        prompts.append(prompt)
        return judge(ep, scene, clip, prompt)

    monkeypatch.setattr(critic, "encode_mp4", recorded)
    monkeypatch.setattr(critic, "judge", asked)
    for choice in (None, "policy"):
        cfg = CriticConfig(url=url, camera=choice, backoff_s=0.01)
        assert critique(cfg, spec, "collect-tiny", 2, out, video).passed
    filmed, seen = sent
    assert len(filmed) == len(out.frames) and filmed[0].shape == out.frames[0].shape
    seen_frames = out.seen[camera.image_key]
    assert len(seen) == len(seen_frames)
    assert seen[0].shape == (shape[0], 2 * shape[1], 3)  # what the policy saw, 2 worlds wide
    assert np.array_equal(seen[1][:, :shape[1]], seen_frames[1][0])
    assert "camera" not in prompts[0] and "camera 'front' showed its control policy" in prompts[1]
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["frames"] for r in requests] == [len(out.frames), len(seen_frames)]
