"""Cameras as observations: what a task declares, what MuJoCo renders, what a policy is handed,
what collect records, and the backend that renders none refused at load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from physai_core.errors import ConfigError, PhysaiError
from stages.sim.env.batched import BatchedEnv
from stages.sim.env.cameras import CameraSpec, image_keys, image_shapes
from stages.sim.env.observation import observe, policy_inputs, sees
from stages.sim.suites.loading import load_scene, load_suite
from stages.sim.tasks.catalog import get_task

ROOT = Path(__file__).resolve().parents[3]
NOMINAL = ROOT / "sim_scenes" / "reach_vision" / "nominal.yaml"
TINY = ROOT / "tests" / "fixtures" / "reach_vision_scene_tiny.yaml"


@pytest.fixture(scope="module")
def env() -> Iterator[BatchedEnv]:
    spec = get_task("reach-vision-v0")
    made = spec.make_env(load_scene(NOMINAL), 4, 0)
    made.reset()
    yield made
    made.close()


def red(frame: np.ndarray) -> np.ndarray:
    """Pixels of the red target marker. Shape: (H, W), bool."""
    f = frame.astype(np.int32)
    return (f[..., 0] > 140) & (f[..., 1] < 70) & (f[..., 2] < 70)


def test_the_vision_task_declares_its_camera_and_hides_the_target_from_the_state() -> None:
    spec = get_task("reach-vision-v0")
    assert spec.cameras == (CameraSpec("front", "front", 64, 64),)
    assert image_keys(spec.cameras) == ("front_image",)
    assert image_shapes(spec.cameras) == {"front_image": ((64, 64, 3), "uint8")}
    assert spec.obs_dim == 17
    assert not any(name.startswith("target") for name in spec.obs_names)
    assert get_task("reach-v0").cameras == ()


def test_every_world_is_rendered_and_the_target_is_where_the_world_put_it(env: Any) -> None:
    images = env.camera_images()
    assert list(images) == ["front_image"]
    frames = images["front_image"]
    assert frames.shape == (4, 64, 64, 3) and frames.dtype == np.uint8
    targets = env.episode_conditions()
    ys = targets["target_y"]
    # the front camera looks back at the arm: world +y is image +x (columns)
    columns = [np.argwhere(red(f))[:, 1].mean() for f in frames]
    assert all(red(f).sum() >= 2 for f in frames)
    order = np.argsort(ys)
    assert np.all(np.diff(np.asarray(columns)[order]) > 0), (ys, columns)


def test_a_state_policy_gets_the_state_and_a_policy_that_sees_gets_its_images(env: Any) -> None:
    obs = env.clean_observation()

    def state_policy(o: np.ndarray) -> np.ndarray:
        return np.zeros((len(o), 7), np.float32)

    def seeing(o: object) -> np.ndarray:
        return np.zeros((4, 7), np.float32)

    seeing.inputs = ("obs", "front_image")  # type: ignore[attr-defined]
    assert not sees(state_policy) and policy_inputs(state_policy) == ("obs",)
    assert observe(env, obs, state_policy) is obs
    given = observe(env, obs, seeing)
    assert set(given) == {"obs", "front_image"} and given["obs"] is obs
    assert given["front_image"].shape == (4, 64, 64, 3)

    def wants_depth(o: object) -> np.ndarray:
        return np.zeros((4, 7), np.float32)

    wants_depth.inputs = ("obs", "front_depth")  # type: ignore[attr-defined]
    with pytest.raises(PhysaiError, match=r"front_depth.*front_image"):
        observe(env, obs, wants_depth)


def test_collect_records_what_the_camera_saw() -> None:
    from stages.sections.models import CollectConfig
    from stages.steps.collect import _record_round

    spec = get_task("reach-vision-v0")
    env = spec.make_env(load_scene(TINY), 2, 0)
    try:
        cfg = CollectConfig(scene="x.yaml", episodes=2, exploration_noise=0.0)
        episodes = _record_round(env, lambda e: e.expert_action(), cfg,
                                 np.random.default_rng(0), 0)
    finally:
        env.close()
    steps = load_scene(TINY).config.episode_steps
    assert [e.images["front_image"].shape for e in episodes] == [(steps, 64, 64, 3)] * 2
    first = episodes[0].images["front_image"]
    assert not np.array_equal(first[0], first[-1])  # the arm moved between them


def test_a_backend_that_renders_no_camera_is_refused_for_a_task_that_sees(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "vision-on-isaaclab", "task": "reach-vision-v0", "backend": "isaaclab",
        "scenes": [{"scene": str(NOMINAL), "episodes": 10, "seed": 1}]}))
    with pytest.raises(ConfigError) as info:
        load_suite(suite)
    message = str(info.value)
    assert "backend" in message and "isaaclab" in message and "renders no camera" in message
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize(("fields", "match"), [
    ({"name": "Front"}, "lower case"),
    ({"width": 0}, "outside"),
    ({"rgb": False}, "neither rgb nor depth"),
])
def test_bad_camera_declarations_are_refused(fields: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"name": "front", "camera": "front", "width": 8, "height": 8}
    with pytest.raises(ValueError, match=match):
        CameraSpec(**{**args, **fields})  # type: ignore[arg-type]
