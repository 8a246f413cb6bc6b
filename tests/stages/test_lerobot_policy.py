"""A LeRobot policy folder read as data and matched to the task before LeRobot runs: where
it may lie, what it must read and emit, which processor files are admitted, how it is named
in the cache, and the one-line refusals. (The export and its parity with LeRobot's own
select_action need the lerobot stage environment: tests/lerobot/test_act_parity.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stages.environments import EnvironmentMissingError
from stages.errors import ConfigError
from stages.imported import (
    ImportConfig,
    Where,
    cache_inputs,
    check_reference,
    check_source,
    import_policy,
)
from stages.lerobot_policy import folder_digest, pretrained_folder, read_folder
from stages.sim.tasks import TaskSpec, get_task

FILE, FIELD = "pipeline.yaml", "train.source"


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    return get_task("reach-vision-v0")


def step(name: str, **config: Any) -> dict[str, Any]:
    return {"registry_name": name, "config": config}


def write_folder(folder: Path, **changes: Any) -> Path:
    """A folder as LeRobot 0.6's ``save_pretrained`` leaves it for an ACT policy of
    reach-vision-v0 (weights are not read here), with ``changes`` applied to config.json."""
    config: dict[str, Any] = {
        "type": "act", "chunk_size": 10, "n_action_steps": 10, "temporal_ensemble_coeff": None,
        "input_features": {"observation.state": {"type": "STATE", "shape": [17]},
                           "observation.images.front": {"type": "VISUAL",
                                                        "shape": [3, 64, 64]}},
        "output_features": {"action": {"type": "ACTION", "shape": [7]}},
    } | changes
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "policy_preprocessor.json").write_text(json.dumps({"steps": [
        step("rename_observations_processor", rename_map={}), step("to_batch_processor"),
        step("device_processor", device="cpu"), step("normalizer_processor", eps=1e-8)]}))
    (folder / "policy_postprocessor.json").write_text(json.dumps({"steps": [
        step("unnormalizer_processor", eps=1e-8), step("device_processor", device="cpu")]}))
    return folder


def refusal(path: Path, spec: TaskSpec) -> str:
    with pytest.raises(ConfigError) as info:
        read_folder(path, spec, FILE, FIELD)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{FILE}: {FIELD}")
    return message


def test_the_folder_is_matched_to_the_tasks_state_camera_and_actions(
    tmp_path: Path, spec: TaskSpec
) -> None:
    folder = read_folder(write_folder(tmp_path / "p"), spec, FILE, FIELD)
    assert folder.policy_type == "act"
    assert folder.inputs == {"observation.state": "obs",
                             "observation.images.front": "front_image"}
    assert folder.images == {"front_image": (64, 64, 3)}
    assert folder.chunk_spec == {"size": 10, "execute": 10}
    ensembling = write_folder(tmp_path / "e", n_action_steps=1, temporal_ensemble_coeff=0.01)
    assert read_folder(ensembling, spec, FILE, FIELD).chunk_spec == {"size": 10,
                                                                     "ensemble": 0.01}


def test_lerobot_train_outputs_and_checkpoints_are_found(tmp_path: Path) -> None:
    run = tmp_path / "outputs" / "train" / "act"
    inner = write_folder(run / "checkpoints" / "last" / "pretrained_model")
    assert pretrained_folder(run) == inner
    assert pretrained_folder(run / "checkpoints" / "last") == inner
    assert pretrained_folder(inner) == inner
    assert pretrained_folder(tmp_path / "outputs") is None


@pytest.mark.parametrize(("changes", "named", "says"), [
    ({"type": "diffusion"}, "diffusion", "supported: act"),
    ({"input_features": {"observation.state": {"type": "STATE", "shape": [7]}}},
     "observation.state [7]", "task reach-vision-v0's 17"),
    ({"input_features": {"observation.state": {"type": "STATE", "shape": [17]},
                         "observation.images.top": {"type": "VISUAL", "shape": [3, 64, 64]}}},
     "observation.images.top", "its cameras: observation.images.front"),
    ({"input_features": {"observation.state": {"type": "STATE", "shape": [17]},
                         "observation.images.front": {"type": "VISUAL",
                                                      "shape": [3, 96, 96]}}},
     "observation.images.front [3, 96, 96]", "[3, 64, 64]"),
    ({"output_features": {"action": {"type": "ACTION", "shape": [6]}}},
     "action [6]", "task reach-vision-v0's 7"),
])
def test_a_mismatch_with_the_task_is_one_line(
    tmp_path: Path, spec: TaskSpec, changes: dict[str, Any], named: str, says: str
) -> None:
    message = refusal(write_folder(tmp_path / "p", **changes), spec)
    assert f"(value: {named!r})" in message and says in message


def test_a_processor_step_named_by_class_path_is_refused(tmp_path: Path, spec: TaskSpec) -> None:
    folder = write_folder(tmp_path / "p")
    (folder / "policy_postprocessor.json").write_text(json.dumps({"steps": [
        {"class": "os.system", "config": {}}]}))
    assert "not named by LeRobot's registry" in refusal(folder, spec)
    (folder / "policy_postprocessor.json").unlink()
    assert "no processor file" in refusal(folder, spec)


def test_a_folder_that_is_no_policy_is_refused_at_config_load(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    problems = check_source(ImportConfig(source="empty"), tmp_path / FILE)
    assert len(problems) == 1 and "not a LeRobot policy" in problems[0].message
    write_folder(tmp_path / "run" / "pretrained_model")
    assert check_source(ImportConfig(source="run"), tmp_path / FILE) == []
    check_reference(str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="LeRobot policy folder"):
        check_reference(str(tmp_path / "empty"))


def test_the_cache_key_follows_every_file_of_the_folder(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "p")
    cfg = ImportConfig(source="p")
    before = cache_inputs(cfg, tmp_path / FILE)
    assert before == {"sha256": folder_digest(folder)}
    (folder / "policy_preprocessor_step_3_normalizer_processor.safetensors").write_bytes(b"s")
    assert cache_inputs(cfg, tmp_path / FILE) != before


def test_the_import_refuses_a_mapping_a_wrong_digest_and_a_missing_environment(
    tmp_path: Path, spec: TaskSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_folder(tmp_path / "p")
    where = Where(FILE, FIELD)
    with pytest.raises(ConfigError, match="matched to the task by its feature names"):
        import_policy(ImportConfig(source="p", inputs={"obs": [0]}), spec, base=tmp_path,
                      where=where)
    with pytest.raises(ConfigError, match=f"has sha256 {folder_digest(folder)}"):
        import_policy(ImportConfig(source="p", sha256="0" * 64), spec, base=tmp_path,
                      where=where)
    monkeypatch.setenv("PHYSAI_ENV_LEROBOT_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(EnvironmentMissingError, match="make lerobot"):
        import_policy(ImportConfig(source="p"), spec, base=tmp_path, where=where)
