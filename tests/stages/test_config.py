from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from stages.config import load_pipeline
from stages.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of configs/ and sim_scenes/ that a test may edit."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    shutil.copytree(ROOT / "sim_scenes", tmp_path / "sim_scenes")
    return tmp_path


def edit(path: Path, change: dict[str, dict[str, object]]) -> None:
    data = yaml.safe_load(path.read_text())
    for section, fields in change.items():
        data.setdefault(section, {}).update(fields)
    path.write_text(yaml.safe_dump(data))


def test_default_config_loads_whole() -> None:
    pipeline = load_pipeline(ROOT / "configs" / "reach.yaml")
    assert pipeline.config.task == "reach-v0"
    assert len(pipeline.suite.scenes) >= 3
    assert len(pipeline.suite_digest) == 64


def test_misspelled_field_names_file_and_field(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    edit(cfg, {"train": {"epocs": 5}})
    with pytest.raises(ConfigError) as err:
        load_pipeline(cfg)
    message = str(err.value)
    assert str(cfg) in message and "train.epocs" in message and "unknown field" in message
    assert "\n" not in message


def test_every_problem_is_reported_at_once(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    edit(cfg, {"train": {"lr": -1}, "collect": {"episodes": 0}})
    with pytest.raises(ConfigError) as err:
        load_pipeline(cfg)
    fields = {p.field for p in err.value.problems}
    assert {"train.lr", "collect.episodes"} <= fields


def test_missing_scene_file_is_named(project: Path) -> None:
    (project / "sim_scenes" / "reach" / "noisy_sensors.yaml").unlink()
    with pytest.raises(ConfigError) as err:
        load_pipeline(project / "configs" / "reach.yaml")
    assert "noisy_sensors.yaml" in str(err.value)
    assert "suite.yaml" in str(err.value)


def test_missing_suite_reference_is_named(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    edit(cfg, {"validate": {"suite": "../sim_scenes/reach/nope.yaml"}})
    with pytest.raises(ConfigError) as err:
        load_pipeline(cfg)
    assert "validate.suite" in str(err.value) and "nope.yaml" in str(err.value)


def test_unknown_edge_target_lists_valid_ones(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    edit(cfg, {"package": {"target": "jetson-agx-thorr"}})
    with pytest.raises(ConfigError) as err:
        load_pipeline(cfg)
    assert "jetson-agx-thor" in str(err.value) and "package" in str(err.value)


def test_changing_a_validation_scene_changes_only_validation_digest(project: Path) -> None:
    cfg = project / "configs" / "reach.yaml"
    before = load_pipeline(cfg)
    scene = project / "sim_scenes" / "reach" / "wide_targets.yaml"
    scene.write_text(scene.read_text().replace("episode_steps: 100", "episode_steps: 101"))
    after = load_pipeline(cfg)
    assert after.stage_digest("validate") != before.stage_digest("validate")
    for stage in ("collect", "train", "package", "promote"):
        assert after.stage_digest(stage) == before.stage_digest(stage)
