"""Each episode's instruction survives every dataset format both ways: our robomimic HDF5 (a
demo attribute, read with h5py), LeRobot v3 (each episode's ``task``, in ``meta/tasks.parquet``
and the frames' ``task_index``), Minari (episode metadata, read with Minari); an episode given
none stays without one; a bad one names the file and field. Scenes draw the instruction of
each episode from their list with their seed, and the collect stage records it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from physai_core.errors import ConfigError
from stages.datasets.formats import Export, check_recording, get_format
from stages.datasets.recording import record_episodes, scripted_expert
from stages.sim.scenes.scene import SceneConfig, episode_instructions
from stages.sim.tasks.catalog import get_task
from tests.stages.datasets.demos import ACT_DIM, OBS_DIM, TASK, synthetic_episodes

TOLD = ("reach the red ball", None, "reach the blue ball", "reach the red ball")
"""The episodes' instructions: two share one, one is given none."""


def told_export() -> Export:
    spec = get_task(TASK)
    episodes = tuple(dataclasses.replace(e, instruction=t)
                     for e, t in zip(synthetic_episodes(len(TOLD)), TOLD, strict=True))
    return Export(episodes, TASK, spec.obs_names, spec.action_names, spec.control_hz)


def read_back(path: Path, fmt: str) -> tuple[str | None, ...]:
    rec = get_format(fmt).read(path)
    assert rec.task == TASK
    return tuple(e.instruction for e in check_recording(path, rec, OBS_DIM, ACT_DIM))


def test_robomimic_keeps_each_episodes_instruction_as_a_demo_attribute(tmp_path: Path) -> None:
    path = tmp_path / "told.hdf5"
    get_format("robomimic").write(path, told_export())
    with h5py.File(path, "r") as f:
        said = [f["data"][f"demo_{i}"].attrs.get("instruction") for i in range(len(TOLD))]
    assert [s.decode() if isinstance(s, bytes) else s for s in said] == list(TOLD)
    assert read_back(path, "robomimic") == TOLD


def test_lerobot_keeps_each_episodes_instruction_as_its_task(tmp_path: Path) -> None:
    import pandas as pd
    import pyarrow.parquet as pq

    path = tmp_path / "told"
    get_format("lerobot").write(path, told_export())
    tasks = pd.read_parquet(path / "meta" / "tasks.parquet")
    assert list(tasks.index) == ["reach the red ball", TASK, "reach the blue ball"]
    assert list(tasks["task_index"]) == [0, 1, 2]
    episodes = pq.read_table(path / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    assert episodes.column("tasks").to_pylist() == [
        ["reach the red ball"], [TASK], ["reach the blue ball"], ["reach the red ball"]]
    info = json.loads((path / "meta" / "info.json").read_text())
    assert info["total_tasks"] == 3 and info["physai_task"] == TASK
    assert read_back(path, "lerobot") == TOLD


def test_minari_keeps_each_episodes_instruction_in_its_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    minari = pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    path = tmp_path / "minari" / "physai" / "told-v0"
    get_format("minari").write(path, told_export())
    loaded = minari.load_dataset("physai/told-v0")
    meta = loaded.storage.get_episode_metadata(range(len(TOLD)))
    assert [m.get("instruction") for m in meta] == list(TOLD)
    assert read_back(path, "minari") == TOLD


def test_an_instruction_that_is_not_text_names_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.hdf5"
    get_format("robomimic").write(path, told_export())
    with h5py.File(path, "r+") as f:
        f["data"]["demo_0"].attrs["instruction"] = 7
    with pytest.raises(ConfigError) as caught:
        read_back(path, "robomimic")
    assert "data/demo_0.attrs.instruction" in str(caught.value) and "7" in str(caught.value)


def test_a_scene_draws_each_episodes_instruction_from_its_list_with_its_seed() -> None:
    scene = SceneConfig.model_validate({
        "name": "s", "task": TASK, "episode_steps": 5,
        "randomization": {"target_low": [0.3, 0.0, 0.3], "target_high": [0.3, 0.0, 0.3]},
        "instruction": ["reach the red ball", "reach the blue ball"]})
    drawn = episode_instructions(scene, 40, seed=3)
    assert drawn == episode_instructions(scene, 40, seed=3)
    assert drawn != episode_instructions(scene, 40, seed=4)
    assert set(drawn or ()) == {"reach the red ball", "reach the blue ball"}
    one = scene.model_copy(update={"instruction": "reach"})
    assert episode_instructions(one, 3, 0) == ("reach",) * 3
    assert episode_instructions(scene.model_copy(update={"instruction": None}), 3, 0) is None
    for bad in ([], ["a", "a"], [" "]):
        with pytest.raises(ValueError, match="instruction"):
            SceneConfig.model_validate({**scene.model_dump(by_alias=True), "instruction": bad})


def test_recorded_episodes_keep_the_instruction_of_their_world() -> None:
    from stages.sim.scenes.scene import Scene

    spec = get_task(TASK)
    config = SceneConfig.model_validate({
        "name": "s", "task": TASK, "episode_steps": 3,
        "randomization": {"target_low": [0.3, 0.0, 0.3], "target_high": [0.3, 0.0, 0.3]}})
    env = spec.make_env(Scene(config, Path("s.yaml")), 2, 0)
    try:
        episodes = record_episodes(env, scripted_expert, lambda o, i, label: label, 0,
                                   ("reach the red ball", "reach the blue ball"))
    finally:
        env.close()
    assert [e.instruction for e in episodes] == ["reach the red ball", "reach the blue ball"]
    assert np.isfinite(episodes[0].obs).all()
