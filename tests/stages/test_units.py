"""Action units at every boundary: a Gymnasium task states its native range, a dataset recorded
in the environment's own units is converted on import (and says so), and an external policy
declared native is mapped to the task's convention while one declared normalized must keep to
-1..1.

The recordings come from Minari's own ``DataCollector`` wrapping Gymnasium's
InvertedPendulum-v5, driven by a PD law in newtons (the action Box is -3..3 N)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from physai_core.errors import ConfigError
from stages.artifacts.records import Producer
from stages.core.units import ActionRange
from stages.datasets.formats import get_format
from stages.datasets.importer import convert, export_dataset, publish_converted
from stages.policies.local import load_actor
from stages.sim.tasks.catalog import TaskSpec, get_task
from stages.storage.store import LocalStore
from stages.training.import_checks import probe_observations
from stages.training.import_sources import Where
from stages.training.imported import ImportConfig, import_policy
from tests.fixtures.imported.policies import FORCE_LIMIT, PD_GAINS, pd_actions, pd_onnx

TASK = "gymnasium:InvertedPendulum-v5"
WHERE = Where("pipeline.yaml", "train.source")
PRODUCER = Producer(stage="import", stage_version="1", config_digest="0" * 64,
                    code_revision="test")


def pd_native_onnx(path: Path, gains: tuple[float, ...] = PD_GAINS) -> Path:
    """The PD law in the environment's own units: ``clip(obs @ K, -3, 3)`` newtons, as ONNX
    ``obs`` -> ``actions`` (what a team that trained against raw Gymnasium would export)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k = np.asarray(gains, np.float32).reshape(-1, 1)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "K"], ["force"]),
         helper.make_node("Clip", ["force", "low", "high"], ["actions"])],
        "pd_newtons",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", k.shape[0]])],
        [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", 1])],
        initializer=[numpy_helper.from_array(k, "K"),
                     numpy_helper.from_array(np.array(-FORCE_LIMIT, np.float32), "low"),
                     numpy_helper.from_array(np.array(FORCE_LIMIT, np.float32), "high")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="someone-else")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def record_pendulum(dataset_id: str, episodes: int, steps: int, noise: float = 0.5,
                    seed: int = 0) -> None:
    """Record ``episodes`` episodes of InvertedPendulum-v5 (at most ``steps`` steps each) with
    Minari's ``DataCollector`` as ``dataset_id`` under ``$MINARI_DATASETS_PATH``; the PD law
    acts in newtons, plus Gaussian noise of std ``noise`` N, clipped to the Box's -3..3."""
    import gymnasium
    from minari import DataCollector

    gains = np.asarray(PD_GAINS)
    collector = DataCollector(gymnasium.make("InvertedPendulum-v5", max_episode_steps=steps))
    rng = np.random.default_rng(seed)
    for i in range(episodes):
        obs, _ = collector.reset(seed=seed + i)
        done = False
        while not done:
            force = np.clip(gains @ obs + rng.normal(0.0, noise), -FORCE_LIMIT, FORCE_LIMIT)
            obs, _, terminated, truncated, _ = collector.step(np.array([force], np.float32))
            done = terminated or truncated
    with pytest.warns(UserWarning, match="eval_env"):
        collector.create_dataset(
            dataset_id=dataset_id, algorithm_name="PD law in newtons",
            author="physai-flows tests", author_email="tests@example.org",
            code_permalink="https://example.org/physai-flows",
            description="InvertedPendulum-v5 driven by a PD law in the environment's units")
    collector.close()


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    pytest.importorskip("gymnasium")
    return get_task(TASK)


def test_a_gymnasium_task_states_its_native_range_and_ours_coincide(spec: TaskSpec) -> None:
    assert spec.native_actions == ActionRange((-3.0,), (3.0,))
    assert spec.action_units == ("-1..1 maps to -3..3",)
    native = spec.action_range()
    np.testing.assert_allclose(native.to_native(np.array([[-1.0], [0.5], [1.0]])),
                               [[-3.0], [1.5], [3.0]])
    np.testing.assert_allclose(native.to_normalized(np.array([[-3.0], [1.5], [6.0]])),
                               [[-1.0], [0.5], [2.0]])
    reach = get_task("reach-v0")
    assert reach.native_actions is None and reach.action_range().is_identity
    with pytest.raises(ValueError, match="low"):
        ActionRange((1.0,), (-1.0,))


def test_a_native_minari_recording_is_converted_on_import_and_says_so(
    spec: TaskSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    record_pendulum("pd/pendulum-v0", episodes=3, steps=20)
    source = tmp_path / "minari" / "pd" / "pendulum-v0"
    raw = get_format("minari").read(source)
    native = np.concatenate([e.actions for e in raw.episodes])
    assert np.abs(native).max() > 1.5  # newtons: the oracle below can fail
    assert get_format("minari").action_units == "native" and raw.action_units is None

    converted = convert(source, "minari", tmp_path / "scratch", TASK)
    assert converted.action_units == "native"
    assert converted.converted_from == ActionRange((-3.0,), (3.0,))
    with h5py.File(converted.path, "r") as f:
        stored = np.concatenate([f[f"data/demo_{i}/actions"][()] for i in range(3)])
        env_args = json.loads(f["data"].attrs["env_args"])
    np.testing.assert_allclose(stored, native / 3.0, atol=1e-6)
    assert env_args["source"]["action_units"] == "native"
    assert env_args["source"]["native_actions"] == {"low": [-3.0], "high": [3.0]}

    # Declared normalized, the actions stay as recorded (and nothing says they were converted).
    as_is = convert(source, "minari", tmp_path / "scratch2", TASK, action_units="normalized")
    assert as_is.converted_from is None and as_is.conversion == "none"
    with h5py.File(as_is.path, "r") as f:
        np.testing.assert_array_equal(f["data/demo_0/actions"][()], raw.episodes[0].actions)
        assert "action_units" not in json.loads(f["data"].attrs["env_args"])["source"]

    # What this project exports says normalized, so it comes back once, not divided twice.
    store = LocalStore(tmp_path / "store")
    dataset = publish_converted(converted, store, PRODUCER, None)
    for fmt, out in (("minari", tmp_path / "out" / "physai" / "pendulum-v0"),
                     ("lerobot", tmp_path / "lerobot")):
        export_dataset(dataset, store, fmt, out)
        back = convert(out, fmt, tmp_path / f"scratch-{fmt}", TASK)
        assert back.action_units == "normalized" and back.converted_from is None, fmt
        with h5py.File(back.path, "r") as f:
            np.testing.assert_allclose(f["data/demo_0/actions"][()], stored[:20], atol=1e-6)


def bring(tmp_path: Path, spec: TaskSpec, **fields: object) -> tuple[np.ndarray, object]:
    """Import, store the result as a file and run it on probe observations."""
    imported = import_policy(ImportConfig(**fields), spec, base=tmp_path, where=WHERE)
    path = tmp_path / "stored.onnx"
    path.write_bytes(imported.onnx)
    return load_actor(path)(probe_observations(spec.obs_dim, seed=3)), imported


def test_a_policy_declared_native_is_mapped_to_the_convention(
    tmp_path: Path, spec: TaskSpec
) -> None:
    source = pd_native_onnx(tmp_path / "newtons.onnx")
    expected = pd_actions(probe_observations(4, seed=3))
    actions, imported = bring(tmp_path, spec, source="newtons.onnx", action_units="native")
    np.testing.assert_allclose(actions, expected, atol=1e-6)
    assert not imported.as_given and imported.converted_from == spec.action_range()
    assert imported.parity_max_abs_diff <= 1e-6
    # Undeclared, the file is stored as given, as before units were declared: the mapping
    # above is what made the difference.
    raw_actions, as_given = bring(tmp_path, spec, source="newtons.onnx")
    assert as_given.as_given and as_given.onnx == source.read_bytes()
    assert np.abs(raw_actions).max() == pytest.approx(FORCE_LIMIT)
    # The same law in the convention, declared so, passes the range check unchanged.
    pd_onnx(tmp_path / "normalized.onnx")
    same, declared = bring(tmp_path, spec, source="normalized.onnx", action_units="normalized")
    assert declared.as_given
    np.testing.assert_allclose(same, actions, atol=1e-6)


def test_a_policy_declared_normalized_that_leaves_the_range_is_one_line(
    tmp_path: Path, spec: TaskSpec
) -> None:
    pd_native_onnx(tmp_path / "newtons.onnx")
    with pytest.raises(ConfigError) as err:
        bring(tmp_path, spec, source="newtons.onnx", action_units="normalized")
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("pipeline.yaml: train.action_units: ")
    assert "reach 3 (outside -1..1)" in message and "action_units native" in message


def test_the_pipeline_yaml_declares_a_policy_native(tmp_path: Path, spec: TaskSpec) -> None:
    import yaml

    from stages.pipeline.config import load_pipeline

    root = Path(__file__).resolve().parents[1] / "fixtures" / "imported"
    pd_native_onnx(tmp_path / "newtons.onnx")
    config = {"name": "units", "task": TASK,
              "train": {"source": "newtons.onnx", "action_units": "native"},
              "validate": {"suite": str(root / "suite.yaml"), "min_success": 0.5},
              "promote": {"model_name": "units"}}
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    train = load_pipeline(tmp_path / "pipeline.yaml").config.train
    assert isinstance(train, ImportConfig) and train.action_units == "native"
    config["train"]["action_units"] = "newtons"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"train\.action_units"):
        load_pipeline(tmp_path / "bad.yaml")


@pytest.mark.parametrize(("collect", "message"), [
    ({"scene": "s.yaml", "episodes": 2, "action_units": "native"},
     "action_units applies only to an imported source"),
    ({"source": "sha256:" + "a" * 64, "action_units": "native"},
     "action_units applies only to a source file"),
    ({"source": "d.hdf5", "format": "minari", "action_units": "newtons"},
     "'native' or 'normalized'"),
])
def test_collect_action_units_is_refused_where_it_means_nothing(
    tmp_path: Path, collect: dict[str, object], message: str
) -> None:
    from stages.sections.models import CollectConfig

    with pytest.raises(ValueError, match=message):
        CollectConfig.model_validate(collect)

