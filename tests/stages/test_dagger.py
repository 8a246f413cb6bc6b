"""DAgger's rounds: the student drives, the expert labels what the student visits, a world
follows the expert with chance beta, and only a dataset with an expert can be continued."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from physai_core.errors import PhysaiError
from stages.sections.models import DaggerConfig
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task
from stages.training.dagger import expert_of, record_round, record_rounds

ROOT = Path(__file__).resolve().parents[2]
SCENE = ROOT / "sim_scenes" / "reach" / "nominal.yaml"
VISION = ROOT / "tests" / "fixtures" / "reach_vision_scene_tiny.yaml"


def still(obs: np.ndarray) -> np.ndarray:
    """A student that never moves."""
    return np.zeros((len(obs), 7), np.float32)


def expert(env: Any) -> np.ndarray:
    return np.asarray(env.expert_action())


def test_the_student_drives_and_the_expert_labels_what_it_visits() -> None:
    env = get_task("reach-v0").make_env(load_scene(SCENE), 6, 0)
    recorded = record_round(env, still, expert, 0.0, np.random.default_rng(0), 0)
    assert recorded.student_success == 0.0
    for episode in recorded.episodes:
        # the arm held still (the student's action), yet every label asks it to move
        assert np.abs(episode.obs[-1, :7] - episode.obs[0, :7]).max() < 0.05
        assert (np.abs(episode.actions).max(axis=1) > 0.05).all()
    # the same state gives the same label: the first step's label is the expert's at reset
    again = get_task("reach-v0").make_env(load_scene(SCENE), 6, 0)
    again.reset()
    np.testing.assert_allclose(np.stack([e.actions[0] for e in recorded.episodes]),
                               again.expert_action(), atol=1e-6)


def test_beta_one_follows_the_expert_everywhere() -> None:
    env = get_task("reach-v0").make_env(load_scene(SCENE), 6, 0)
    recorded = record_round(env, still, expert, 1.0, np.random.default_rng(0), 0)
    assert np.isnan(recorded.student_success)  # no world was the student's alone
    assert all(e.success for e in recorded.episodes)


def test_rounds_record_the_asked_episodes_with_images_for_a_task_that_sees() -> None:
    spec = get_task("reach-vision-v0")

    def seeing(inputs: dict[str, np.ndarray]) -> np.ndarray:
        return np.zeros((len(inputs["obs"]), 7), np.float32)

    seeing.inputs = ("obs", "front_image")  # type: ignore[attr-defined]
    cfg = DaggerConfig(rounds=1, episodes=5, beta=0.0)
    recorded = record_rounds(cfg, spec, load_scene(VISION), 3, seeing, expert, 1, 0)
    assert len(recorded.episodes) == 5
    steps = load_scene(VISION).config.episode_steps
    assert {e.images["front_image"].shape for e in recorded.episodes} == {(steps, 64, 64, 3)}


def test_an_imported_dataset_has_no_expert_to_continue_with() -> None:
    dataset = SimpleNamespace(expert="import:minari:sha256:" + "0" * 64, digest="d" * 64)
    with pytest.raises(PhysaiError, match="imported"):
        expert_of(dataset, None)  # type: ignore[arg-type]
