"""Tiled cameras (stages/sim/env/tiled.py): the same images and the same validation outcomes as
rendering one world at a time, in this process and over worker processes, on tiny runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from physai_core.errors import ConfigError
from stages.evaluation.rollout import rollout
from stages.sim.env.tiled import TILES_ENV, WORLDS_PER_PROCESS, tile_processes
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "tests" / "fixtures" / "reach_vision_scene_tiny.yaml"


@pytest.fixture(scope="module")
def every_look(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny reach-vision scene whose worlds differ in every way a look can: light colour and
    direction, geom colours, camera pose, image noise, and randomized masses."""
    scene = yaml.safe_load(TINY.read_text())
    scene["randomization"].update(
        light_intensity_scale=[0.5, 1.0], light_direction_jitter=20,
        geom_colours={"table": [[0.3, 0.3, 0.3], [0.6, 0.6, 0.6]],
                      "link3": [[0.6, 0.6, 0.6], [0.95, 0.95, 0.95]]},
        camera_pos_jitter=0.02, camera_angle_jitter=3, image_noise_std=3,
        mass_scale=[0.8, 1.2])
    path = tmp_path_factory.mktemp("tiled") / "every_look.yaml"
    path.write_text(yaml.safe_dump(scene))
    return path


def images(scene: Path, worlds: int, tiles: str, steps: int = 3) -> dict[str, np.ndarray]:
    """The camera images of ``worlds`` worlds after ``steps`` expert steps, rendered as
    ``tiles`` says."""
    env: Any = get_task("reach-vision-v0").make_env(load_scene(scene), worlds, 7)
    env.camera_tiles = tiles
    try:
        env.reset()
        for _ in range(steps):
            env.step(env.expert_action())
        first = env.camera_images()
        env.step(env.expert_action())
        return {"first": first["front_image"], "next": env.camera_images()["front_image"]}
    finally:
        env.close()


@pytest.fixture(scope="module")
def one_at_a_time(every_look: Path) -> dict[str, np.ndarray]:
    return images(every_look, 5, "off")


@pytest.mark.parametrize("tiles", ["on", "2"])
def test_tiles_give_the_images_of_one_world_at_a_time(
    every_look: Path, one_at_a_time: dict[str, np.ndarray], tiles: str
) -> None:
    # 5 worlds: a 3 x 2 grid with one tile empty; "2": two worker processes of 3 and 2 worlds
    tiled = images(every_look, 5, tiles)
    for when in ("first", "next"):
        assert tiled[when].shape == (5, 64, 64, 3)
        assert np.array_equal(tiled[when], one_at_a_time[when]), when
    # the worlds do look different, so a tile in the wrong place would show
    assert len({frame.tobytes() for frame in tiled["first"]}) == 5


class ImagePolicy:
    """The expert's action bent by each world's image: an image off by one level in one pixel
    changes the world's actions, hence its return."""

    inputs = ("obs", "front_image")

    def __init__(self, env: Any) -> None:
        self._env = env

    def __call__(self, observation: Any) -> np.ndarray:
        image = observation["front_image"].astype(np.float64)
        bend = np.sin(image.reshape(len(image), -1) @ np.linspace(0.0, 1.0, image[0].size))
        return np.asarray(self._env.expert_action() * (1.0 + 0.3 * bend[:, None]))


def validation(scene: Path, tiles: str) -> Any:
    """A validation rollout of 4 worlds of ``scene`` with a policy that reads the camera."""
    env: Any = get_task("reach-vision-v0").make_env(load_scene(scene), 4, 11)
    env.camera_tiles = tiles
    try:
        return rollout(env, ImagePolicy(env))
    finally:
        env.close()


def test_validation_outcomes_are_the_same_with_tiles_on_and_off(every_look: Path) -> None:
    off, on = validation(every_look, "off"), validation(every_look, "on")
    assert np.array_equal(off.success, on.success)
    assert np.array_equal(off.returns, on.returns)
    assert np.array_equal(off.final_reward, on.final_reward)
    assert len(set(off.returns.tolist())) == 4


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from stages.core.settings import camera_tiles

    monkeypatch.delenv(TILES_ENV, raising=False)
    assert camera_tiles() == "auto"
    assert tile_processes(4, "auto") == 1  # auto: too few worlds for a second process
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert tile_processes(2 * WORLDS_PER_PROCESS, "auto") == 2
    assert tile_processes(2 * WORLDS_PER_PROCESS - 1, "auto") == 1
    for value, processes in (("off", -1), ("0", -1), ("ON", 1), ("1", 1), (" 3 ", 3)):
        monkeypatch.setenv(TILES_ENV, value)
        assert tile_processes(64, camera_tiles()) == processes
    monkeypatch.setenv(TILES_ENV, "many")
    with pytest.raises(ConfigError, match=f"environment: {TILES_ENV}: must be off, on, auto"):
        camera_tiles()


@pytest.fixture()
def depth_env() -> Iterator[Any]:
    from stages.sim.env.cameras import CameraSpec
    from stages.sim.tasks import reach
    from stages.sim.tasks.reach_arm import ReachArmEnv
    from stages.sim.tasks.reach_vision import ARM7_VISION_XML

    env = ReachArmEnv(load_scene(TINY), 2, 0, task_name="reach-vision-v0",
                      model_path=ARM7_VISION_XML, frame_skip=reach.FRAME_SKIP,
                      control_hz=reach.CONTROL_HZ, payload_body="link7", arm=reach.ARM,
                      cameras=(CameraSpec("front", "front", 16, 16, depth=True),))
    env.reset()
    yield env
    env.close()


def test_a_depth_camera_renders_one_world_at_a_time(depth_env: Any) -> None:
    depth_env.camera_tiles = "on"
    out = depth_env.camera_images()
    assert out["front_depth"].shape == (2, 16, 16, 1)
    assert depth_env._tiled is None


def test_a_daemonic_process_draws_its_tiles_itself(
    every_look: Path, one_at_a_time: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing

    class Daemon:
        daemon = True

    def no_workers(*_: Any) -> None:
        raise AssertionError("a daemonic process started tile workers")

    monkeypatch.setattr(multiprocessing, "current_process", Daemon)
    monkeypatch.setattr("stages.sim.env.tiled.TileWorkers", no_workers)
    assert np.array_equal(images(every_look, 5, "2")["first"], one_at_a_time["first"])


def test_more_worlds_than_a_canvas_holds_are_drawn_in_rounds(
    every_look: Path, one_at_a_time: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("stages.sim.env.tiled.MAX_GRID_SIDE", 128)  # 2 x 2 tiles: rounds of 4, 1
    tiled = images(every_look, 5, "on")
    for when in ("first", "next"):
        assert np.array_equal(tiled[when], one_at_a_time[when]), when


def test_validate_camera_tiles_reaches_the_scene_environment(
        tiny_config: Callable[..., Path]) -> None:
    """``validate.camera_tiles`` in its YAML forms (``off`` and ``on`` are booleans there),
    refused otherwise naming the field, and set on the environment a scene validates in."""
    from pydantic import ValidationError

    from stages.pipeline.config import load_pipeline
    from stages.sections.models import ValidateConfig
    from stages.sim.backends.catalog import make_backend_env

    base = {"suite": "suite.yaml", "min_success": 0.5}
    forms = {False: "off", True: "on", "auto": "auto", 3: "3", "2": "2", None: None}
    for given, read in forms.items():
        assert ValidateConfig(**base, camera_tiles=given).camera_tiles == read
    for bad in ("sometimes", 1.5, -1):
        with pytest.raises(ValidationError, match="camera_tiles"):
            ValidateConfig(**base, camera_tiles=bad)
    pipeline = load_pipeline(tiny_config(validate={"camera_tiles": False}))
    cfg = pipeline.config.validate_
    assert cfg.camera_tiles == "off"
    env: Any = make_backend_env("mujoco", get_task("reach-vision-v0"), load_scene(TINY), 2, 7,
                                camera_tiles=cfg.camera_tiles)
    try:
        env.reset()
        assert env.camera_tiles == "off"
        assert env._tiled_cameras() is None  # one world at a time
    finally:
        env.close()
