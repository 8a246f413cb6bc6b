"""A LeRobot policy folder read as data and matched to the task before LeRobot runs: where
it may lie, what it must read and emit, which processor files are admitted, how it is named
in the cache, and the one-line refusals. (The export and its parity with LeRobot's own
select_action need the lerobot stage environment: tests/lerobot/test_act_parity.py and
tests/lerobot/test_diffusion_parity.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from physai_core.errors import ConfigError, PhysaiError
from stages.core.environments import EnvironmentMissingError
from stages.policies.lerobot import folder_digest, pretrained_folder, read_folder
from stages.sim.tasks.catalog import TaskSpec, get_task
from stages.training.import_sources import Where
from stages.training.imported import ImportConfig, cache_inputs, check_source, import_policy
from stages.training.policy_reference import check_reference

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


DIFFUSION = {"type": "diffusion", "n_obs_steps": 2, "horizon": 8, "n_action_steps": 4,
             "num_train_timesteps": 100, "num_inference_steps": 10,
             "noise_scheduler_type": "DDPM", "prediction_type": "epsilon"}
"""config.json's sampling fields of a tiny diffusion policy (tests/fixtures/lerobot_diffusion.py).
"""


def test_a_diffusion_policy_runs_n_action_steps_of_each_chunk_on_a_history(
    tmp_path: Path, spec: TaskSpec
) -> None:
    folder = read_folder(write_folder(tmp_path / "d", **DIFFUSION), spec, FILE, FIELD)
    assert folder.policy_type == "diffusion"
    assert folder.chunk_spec == {"size": 4, "execute": 4}
    assert (folder.chunk_size, folder.n_obs_steps) == (4, 2)


@pytest.mark.parametrize(("changes", "named", "says"), [
    ({"n_action_steps": 8}, "n_action_steps 8", "1 .. 7"),
    ({"n_obs_steps": 0}, "n_obs_steps 0", "1 .. 8"),
    ({"num_inference_steps": 101}, "num_inference_steps 101", "1 .. 100"),
    ({"noise_scheduler_type": "DPMSolver"}, "noise_scheduler_type 'DPMSolver'", "DDPM, DDIM"),
    ({"prediction_type": "v_prediction"}, "prediction_type 'v_prediction'", "epsilon, sample"),
])
def test_a_diffusion_policy_sampling_out_of_range_is_one_line(
    tmp_path: Path, spec: TaskSpec, changes: dict[str, Any], named: str, says: str
) -> None:
    message = refusal(write_folder(tmp_path / "d", **DIFFUSION | changes), spec)
    assert f"(value: {named!r})" in message and says in message


def test_lerobot_train_outputs_and_checkpoints_are_found(tmp_path: Path) -> None:
    run = tmp_path / "outputs" / "train" / "act"
    inner = write_folder(run / "checkpoints" / "last" / "pretrained_model")
    assert pretrained_folder(run) == inner
    assert pretrained_folder(run / "checkpoints" / "last") == inner
    assert pretrained_folder(inner) == inner
    assert pretrained_folder(tmp_path / "outputs") is None


@pytest.mark.parametrize(("changes", "named", "says"), [
    ({"type": "pi0"}, "pi0", "supported: act, diffusion"),
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


def fake_environment(tmp_path: Path, status: int, message: str) -> Path:
    """An interpreter for the lerobot environment that says ``message`` and exits."""
    script = tmp_path / "lerobot-python"
    script.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit {status}\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize(("status", "error", "shown"), [
    (2, ConfigError, "a LeRobot vqbet policy"),
    (1, PhysaiError, "exit status 1"),
])
def test_the_export_scripts_refusal_is_one_line_and_a_crash_is_reported(
    tmp_path: Path, spec: TaskSpec, monkeypatch: pytest.MonkeyPatch, status: int,
    error: type[Exception], shown: str,
) -> None:
    write_folder(tmp_path / "p")
    python = fake_environment(tmp_path, status, "a LeRobot vqbet policy")
    monkeypatch.setenv("PHYSAI_ENV_LEROBOT_PYTHON", str(python))
    with pytest.raises(error) as info:
        import_policy(ImportConfig(source="p"), spec, base=tmp_path, where=Where(FILE, FIELD))
    assert shown in str(info.value) and str(info.value).startswith(f"{FILE}: {FIELD}")
    if status == 2:
        assert "\n" not in str(info.value)


def test_native_chunk_actions_are_normalized_in_a_graph_that_keeps_its_image_input() -> None:
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    from stages.core.units import ActionRange
    from stages.training.import_checks import normalized_onnx

    # actions (batch, 2, 2) = obs (batch, 2) repeated twice, plus the image's mean
    graph = helper.make_graph(
        [helper.make_node("Unsqueeze", ["obs", "axis"], ["row"]),
         helper.make_node("Concat", ["row", "row"], ["pair"], axis=1),
         helper.make_node("Cast", ["front_image"], ["pixels"], to=TensorProto.FLOAT),
         helper.make_node("ReduceMean", ["pixels"], ["mean"], axes=[1, 2, 3], keepdims=0),
         helper.make_node("Reshape", ["mean", "shape"], ["bias"]),
         helper.make_node("Add", ["pair", "bias"], ["actions"])],
        "chunk", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 2]),
                  helper.make_tensor_value_info("front_image", TensorProto.UINT8,
                                                ["batch", 4, 4, 3])],
        [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", 2, 2])],
        [numpy_helper.from_array(np.array([1], np.int64), "axis"),
         numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    native = ActionRange.of([-3.0, 0.0], [3.0, 10.0])
    raw = normalized_onnx(model.SerializeToString(), native)
    stored = onnx.load_from_string(raw)
    assert [i.name for i in stored.graph.input] == ["obs", "front_image"]
    obs = np.array([[2.0, 3.0], [-4.0, 8.0]], np.float32)
    image = np.stack([np.full((4, 4, 3), 1), np.full((4, 4, 3), 2)]).astype(np.uint8)
    session = onnxruntime.InferenceSession(raw, providers=["CPUExecutionProvider"])
    (actions,) = session.run(["actions"], {"obs": obs, "front_image": image})
    # native (3, 4) and (-2, 10) in -3..3 and 0..10
    expected = np.repeat(np.array([[1.0, -0.2], [-2 / 3, 1.0]], np.float32)[:, None], 2, axis=1)
    np.testing.assert_allclose(actions, expected, atol=1e-6)


def test_camera_keys_feed_a_task_camera_to_a_feature_of_another_name(
    tmp_path: Path, spec: TaskSpec
) -> None:
    features = {"observation.state": {"type": "STATE", "shape": [17]},
                "observation.images.top": {"type": "VISUAL", "shape": [3, 64, 64]}}
    path = write_folder(tmp_path / "p", input_features=features)
    assert "observation.images.top" in refusal(path, spec)
    folder = read_folder(path, spec, FILE, FIELD, {"front": "observation.images.top"})
    assert folder.inputs == {"observation.state": "obs", "observation.images.top": "front_image"}
    for keys, named in (({"wrist": "observation.images.top"}, "wrist"),
                        ({"front": "observation.images.side"}, "observation.images.side")):
        with pytest.raises(ConfigError) as info:
            read_folder(path, spec, FILE, FIELD, keys)
        assert str(info.value).startswith(f"{FILE}: train.camera_keys") and named in str(
            info.value)
    with pytest.raises(ConfigError, match=r"train\.camera_keys: camera keys name"):
        import_policy(ImportConfig(source="policy.onnx", camera_keys={"front": "x"}), spec,
                      base=tmp_path, where=Where(FILE, FIELD))


def test_a_config_without_its_chunking_is_one_line(tmp_path: Path, spec: TaskSpec) -> None:
    folder = write_folder(tmp_path / "p", chunk_size="ten")
    assert "must give chunk_size as a whole number 1 .. 1,024" in refusal(folder, spec)
