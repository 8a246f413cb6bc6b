"""Visual variation of a scene (stages/sim/scenes/scene.py, drawn in stages/sim/env/batched.py,
rendered by stages/sim/env/mujoco_env.py) on reach-vision-v0's front camera: a planted visual
failure (a policy that gives up in dim light) gets the light factor ranked first with the right sign
through the real rollout; the draws are recorded with their units, leave every other draw alone, and
a scene's colour of the target wins over the task's red; bad visual fields are refused at load in
one line naming file, field and value. Tiny: 64 x 64 frames, a few worlds, short episodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from physai_core.errors import ConfigError
from stages.evaluation.suite import evaluate_scene
from stages.sim.scenes.scene import Scene, sweep_variant
from stages.sim.suites.loading import load_scene, load_suite
from stages.sim.tasks.reach_vision import ReachVisionEnv

ROOT = Path(__file__).resolve().parents[3]
SCENES = ROOT / "sim_scenes" / "reach_vision"
DIM = 60.0
"""The planted policy gives up where the front image's mean brightness (0..255) is below this:
about 0.57 of the nominal light, whose frames average about 105."""


def _scene(**look: object) -> Scene:
    """reach-vision-v0's nominal scene in 40-step episodes, with visual fields ``look``."""
    return load_scene(SCENES / "nominal.yaml").replace(episode_steps=40, **look)


class ShyInTheDark:
    """The scripted expert, except that it holds still (zero action) in every world whose
    front image is dim: a policy that reads the camera."""

    inputs = ("obs", "front_image")

    def __init__(self, env: ReachVisionEnv, reads_light: bool = True) -> None:
        self._env = env
        self._reads_light = reads_light

    def __call__(self, observation: Any) -> np.ndarray:
        """The expert's actions, zero where ``observation["front_image"]`` is dim."""
        action = self._env.expert_action()
        brightness = observation["front_image"].mean(axis=(1, 2, 3))
        if self._reads_light:
            action[brightness < DIM] = 0.0
        return action


def test_a_policy_that_gives_up_in_dim_light_gets_the_light_ranked_first() -> None:
    scene = _scene(light_intensity_scale=(0.3, 1.0))
    env = ReachVisionEnv(scene, 24, seed=5, num_threads=1)
    try:
        result, out = evaluate_scene(env, ShyInTheDark(env), scene.name, 24)
    finally:
        env.close()
    assert out.episodes is not None
    light = out.episodes["light_intensity_scale"]
    assert 0.2 < 1 - out.success.mean() < 0.8
    top = result.factors[0]
    assert (top.name, top.unit) == ("light_intensity_scale", "factor")
    assert top.effect < 0 and top.ci_high < 0  # more light, fewer failures
    assert top.mean_failed < top.mean_succeeded
    assert light[~out.success].max() < light[out.success].min()


def test_the_looks_are_drawn_last_and_recorded_with_their_units() -> None:
    look = {"light_intensity_scale": (0.5, 0.9), "light_direction_jitter": 20.0,
            "geom_colours": {"table": ((0.2, 0.3, 0.4), (0.3, 0.4, 0.5))},
            "camera_pos_jitter": 0.02, "camera_angle_jitter": 3.0, "image_noise_std": 5.0}
    plain = ReachVisionEnv(_scene(), 3, seed=2, num_threads=1)
    varied = ReachVisionEnv(_scene(**look), 3, seed=2, num_threads=1)
    assert np.array_equal(plain.reset(), varied.reset())  # targets and states as before
    conditions, units = varied.episode_conditions(), varied.condition_units()
    assert np.array_equal(conditions["target_x"], plain.episode_conditions()["target_x"])
    assert {k: units[k] for k in ("light_intensity_scale", "light_tilt", "colour_table_red",
                                  "camera_offset", "camera_rotation", "image_noise_std")} == {
        "light_intensity_scale": "factor", "light_tilt": "deg", "colour_table_red": "0..1",
        "camera_offset": "m", "camera_rotation": "deg",
        "image_noise_std": "intensity levels (0..255)"}
    assert ((conditions["light_intensity_scale"] >= 0.5)
            & (conditions["light_intensity_scale"] <= 0.9)).all()
    assert (conditions["light_tilt"] <= 20.0).all() and (conditions["camera_rotation"] <= 3).all()
    blue = conditions["colour_table_blue"]
    assert ((blue >= 0.4) & (blue <= 0.5)).all()
    assert (conditions["camera_offset"] <= 0.02 * np.sqrt(3)).all()
    assert "light_intensity_scale" not in plain.episode_conditions()


def test_dimmer_light_gives_darker_frames_and_noise_keeps_other_draws() -> None:
    bright = ReachVisionEnv(_scene(image_noise_std=8.0), 2, seed=4, num_threads=1)
    dim = ReachVisionEnv(_scene(light_intensity_scale=(0.4, 0.4)), 2, seed=4, num_threads=1)
    unseen = ReachVisionEnv(_scene(image_noise_std=8.0), 2, seed=4, num_threads=1)
    try:
        for env in (bright, dim, unseen):
            env.reset()
        noisy, darker = bright.camera_images()["front_image"], dim.camera_images()["front_image"]
        assert darker.mean() < 0.5 * noisy.mean()
        action = bright.expert_action()
        assert np.array_equal(bright.step(action)[0], unseen.step(action)[0])
        again = ReachVisionEnv(_scene(image_noise_std=8.0), 2, seed=4, num_threads=1)
        again.reset()
        assert np.array_equal(again.camera_images()["front_image"], noisy)  # same seed, same noise
        again.close()
    finally:
        for env in (bright, dim, unseen):
            env.close()


def test_a_scene_colour_of_the_target_wins_over_the_tasks_red() -> None:
    blue = ((0.0, 0.0, 0.9), (0.0, 0.0, 1.0))
    env = ReachVisionEnv(_scene(geom_colours={"target": blue}), 2, seed=1, num_threads=1)
    try:
        env.reset()
        frames = env.camera_images()["front_image"].astype(int)
        model, _ = env._render_copy()
        rgba = model.geom_rgba[model.geom("target").id]
        assert rgba[0] == 0.0 and rgba[2] >= 0.9 and rgba[3] == 1.0
        reddish = (frames[..., 0] > 120) & (frames[..., 1] < 60) & (frames[..., 2] < 60)
        bluish = (frames[..., 2] > 120) & (frames[..., 0] < 60)
        assert not reddish.any() and bluish.reshape(2, -1).any(axis=1).all()
    finally:
        env.close()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


HEAD = ("name: s\ntask: {task}\nepisode_steps: 10\nrandomization:\n"
        "  target_low: [0.35, -0.25, 0.15]\n  target_high: [0.6, 0.25, 0.15]\n")


@pytest.mark.parametrize(("task", "line", "field", "words"), [
    ("reach-vision-v0", "geom_colours: {tabel: [[0, 0, 0], [1, 1, 1]]}",
     "randomization.geom_colours.tabel", "has no geom 'tabel'; its named geoms: flange"),
    ("reach-vision-v0", "geom_colours: {table: [[0.5, 0, 0], [0.4, 1, 1]]}",
     "randomization.geom_colours.table", "low <= high"),
    ("reach-vision-v0", "geom_colours: {table: [[0, 0, 0], [1, 1, 2]]}",
     "randomization.geom_colours.table.1.2", "less than or equal to 1"),
    ("reach-vision-v0", "light_intensity_scale: [0, 1]", "randomization.light_intensity_scale",
     "0 < low <= high"),
    ("reach-vision-v0", "image_noise_std: -2", "randomization.image_noise_std",
     "greater than or equal to 0"),
    ("reach-v0", "camera_angle_jitter: 2", "randomization.camera_angle_jitter",
     "observes through no camera"),
])
def test_bad_visual_fields_name_file_field_and_value(
    tmp_path: Path, task: str, line: str, field: str, words: str
) -> None:
    path = write(tmp_path / "s.yaml", HEAD.format(task=task) + f"  {line}\n")
    with pytest.raises(ConfigError) as info:
        load_scene(path)
    message = str(info.value)
    assert f"{path}: {field}:" in message and words in message and "(value: " in message
    assert "\n" not in message and info.value.exit_code == 2


def test_the_suite_loads_and_visual_fields_sweep(tmp_path: Path) -> None:
    suite = load_suite(SCENES / "suite.yaml")
    assert [s.scene.name for s in suite.scenes] == ["nominal", "dim_light", "colours",
                                                    "camera_jitter"]
    assert [s.scene.config.randomization.looks() for s in suite.scenes] == [
        (), ("light_intensity_scale", "light_direction_jitter"), ("geom_colours",),
        ("camera_pos_jitter", "camera_angle_jitter", "image_noise_std")]
    path = write(tmp_path / "s.yaml", HEAD.format(task="reach-vision-v0")
                 + "sweep: {light_intensity_scale: [0.4, 1.0], image_noise_std: [0, 6]}\n")
    scene = load_scene(path)
    held = sweep_variant(scene, scene.config.sweep_points()[1])
    assert held.config.randomization.light_intensity_scale == (0.4, 0.4)
    assert held.config.randomization.image_noise_std == 6.0
    isaac = write(tmp_path / "suite.yaml", "name: x\ntask: reach-v0\nbackend: isaaclab\n"
                  "scenes:\n  - {scene: r.yaml, episodes: 2, seed: 1}\n")
    write(tmp_path / "r.yaml", HEAD.format(task="reach-v0") + "  light_intensity_scale: [0.5, 1]\n")
    with pytest.raises(ConfigError, match="renders no camera, and scene 's' varies how it looks"):
        load_suite(isaac)
