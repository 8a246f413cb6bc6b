"""The registered version as an MLflow model, built from a small packed bundle and registered
against a real ``mlflow server`` on SQLite: MLflow's own loaders read it, its numbers match ONNX
Runtime, the bundle travels with it, the description holds the gate table and the logged
model holds the per-scene rates. Experiments are model-training experiments. A bundle that sees
(``obs`` and an 8 x 8 ``front_image``) is registered too: its signature, input example and
pyfunc carry the image input beside the state."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from stages.artifacts.records import EdgeBundle, GateResult, Producer, SceneResult, SimReport
from stages.tracking.lineage import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, LineageRecorder
from stages.tracking.mlflow_model import BUNDLE_FILE, gate_table, input_example, policy_model
from tests.support import policy_manifest_fields

OBS_DIM, ACT_DIM = 5, 3
NAME = "mm-unit"
VISION_NAME = "mm-unit-vision"
IMAGE, FRAME = "front_image", (8, 8, 3)
PRODUCER = Producer(stage="x", stage_version="1", config_digest="c" * 64, code_revision="r")


@dataclass(frozen=True)
class Registered:
    lineage: LineageRecorder
    version: str
    bundle_tar: Path
    onnx_path: Path
    report: SimReport
    bundle: EdgeBundle


def write_onnx(path: Path, seed: int = 0) -> None:
    """A tiny ONNX policy: actions = tanh(obs @ W + b), float32, opset 17."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.normal(size=(OBS_DIM, ACT_DIM)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.normal(size=ACT_DIM).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["obs", "W", "b"], ["z"]),
         helper.make_node("Tanh", ["z"], ["actions"])],
        "policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", OBS_DIM])],
        [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", ACT_DIM])],
        initializer=[weight, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def write_vision_onnx(path: Path, seed: int = 0) -> None:
    """A tiny ONNX policy that sees: actions = tanh([obs, mean RGB / 255] @ W + b), with
    ``obs`` float32 (batch, OBS_DIM) and ``front_image`` uint8 (batch, 8, 8, 3), opset 17."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weight = rng.normal(size=(OBS_DIM + 3, ACT_DIM)).astype(np.float32)
    weight[OBS_DIM:] *= 8.0
    graph = helper.make_graph(
        [helper.make_node("Cast", [IMAGE], ["pixels"], to=TensorProto.FLOAT),
         helper.make_node("ReduceMean", ["pixels"], ["rgb"], axes=[1, 2], keepdims=0),
         helper.make_node("Mul", ["rgb", "scale"], ["seen"]),
         helper.make_node("Concat", ["obs", "seen"], ["x"], axis=1),
         helper.make_node("Gemm", ["x", "W", "b"], ["z"]),
         helper.make_node("Tanh", ["z"], ["actions"])],
        "policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", OBS_DIM]),
         helper.make_tensor_value_info(IMAGE, TensorProto.UINT8, ["batch", *FRAME])],
        [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", ACT_DIM])],
        initializer=[numpy_helper.from_array(weight, "W"),
                     numpy_helper.from_array(rng.normal(size=ACT_DIM).astype(np.float32), "b"),
                     numpy_helper.from_array(np.array(1 / 255, dtype=np.float32), "scale")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def vision_calibration() -> dict[str, np.ndarray]:
    """The vision bundle's calibration set: 16 states and 16 random frames."""
    rng = np.random.default_rng(2)
    return {"obs": rng.normal(size=(16, OBS_DIM)).astype(np.float32),
            IMAGE: rng.integers(0, 256, (16, *FRAME), dtype=np.uint8)}


def artifacts(scenes: list[tuple[str, float]], gate_passed: bool = True
              ) -> tuple[SimReport, EdgeBundle]:
    """A sim report with one success gate per scene and a bundle record with a latency gate."""
    results = tuple(SceneResult(scene=s, episodes=8, successes=round(8 * r), success_rate=r,
                                ci_low=max(r - 0.3, 0.0), ci_high=min(r + 0.1, 1.0),
                                mean_return=-1.0, mean_final_reward=0.0) for s, r in scenes)
    gates = tuple(GateResult(name=f"success/{s.scene}", measured=s.ci_low, threshold=0.2,
                             passed=s.ci_low >= 0.2, detail="Wilson CI low") for s in results)
    report = SimReport(digest="d" * 64, uri="file:///r", producer=PRODUCER, parents=(),
                       suite="tiny", suite_digest="e" * 64, backend="mujoco",
                       backend_version="4.0.0", scenes=results, gates=gates,
                       passed=all(g.passed for g in gates))
    bundle = EdgeBundle(digest="f" * 64, uri="file:///b", producer=PRODUCER, parents=(),
                        target="jetson-agx-orin", onnx_digest="a" * 64, opset=17,
                        parity_max_abs_diff=1e-7, latency_p50_us=10.0, latency_p99_us=20.0,
                        gates=(GateResult(name="latency/p99_ms", measured=0.02, threshold=20.0,
                                          passed=gate_passed),),
                        passed=gate_passed)
    return report, bundle


def pack(tmp: Path) -> tuple[Path, Path, Path]:
    """Pack the tiny policy; returns (unpacked folder, bundle tar, ONNX file)."""
    from edge.bundle import unpack_bundle
    from edge.pack import pack_policy_bundle
    from edge.targets import get_target

    onnx_path = tmp / "policy.onnx"
    write_onnx(onnx_path)
    calibration = np.random.default_rng(1).normal(size=(16, OBS_DIM)).astype(np.float32)
    fields = policy_manifest_fields([0.0] * OBS_DIM, [1.0] * OBS_DIM, ACT_DIM, model_name=NAME)
    tar = tmp / BUNDLE_FILE
    pack_policy_bundle(tar, onnx_path, calibration, "test observations", fields,
                       get_target("jetson-agx-orin"))
    unpack_bundle(tar, tmp / "unpacked")
    return tmp / "unpacked", tar, onnx_path


def pack_vision(tmp: Path) -> tuple[Path, Path, Path]:
    """Pack the tiny policy that sees; returns (unpacked folder, bundle tar, ONNX file)."""
    from edge.bundle import unpack_bundle
    from edge.pack import pack_policy_bundle
    from edge.targets import get_target

    onnx_path = tmp / "policy.onnx"
    write_vision_onnx(onnx_path)
    fields = policy_manifest_fields([0.0] * OBS_DIM, [1.0] * OBS_DIM, ACT_DIM,
                                    model_name=VISION_NAME)
    fields["io"]["images"] = [{"name": IMAGE, "shape": ["batch", *FRAME], "dtype": "uint8",
                               "layout": "HWC", "channels": "RGB", "camera": "front"}]
    tar = tmp / BUNDLE_FILE
    pack_policy_bundle(tar, onnx_path, vision_calibration(), "rendered frames", fields,
                       get_target("jetson-agx-orin"))
    unpack_bundle(tar, tmp / "unpacked")
    return tmp / "unpacked", tar, onnx_path


@pytest.fixture(scope="module")
def registered(mlflow_server: str, tmp_path_factory: pytest.TempPathFactory) -> Registered:
    tmp = tmp_path_factory.mktemp("mlflow-model")
    unpacked, tar, onnx_path = pack(tmp)
    report, bundle = artifacts([("nominal", 1.0), ("heavy payload", 0.25)])
    lineage = LineageRecorder(mlflow_server)
    run = lineage.start_run("mm-unit-exp", "promote")
    model = policy_model(unpacked, tar, report, bundle)
    version = lineage.register_policy(NAME, model, run.run_id, {"physai.gates_passed": "false"})
    lineage.end_run(run.run_id)
    lineage.set_alias(NAME, "champion", version)
    return Registered(lineage, version, tar, onnx_path, report, bundle)


@pytest.fixture(scope="module")
def registered_vision(mlflow_server: str, tmp_path_factory: pytest.TempPathFactory,
                      ) -> tuple[Registered, list[logging.LogRecord]]:
    """The vision bundle registered as VISION_NAME@champion, with the warnings MLflow logged."""
    tmp = tmp_path_factory.mktemp("mlflow-model-vision")
    unpacked, tar, onnx_path = pack_vision(tmp)
    report, bundle = artifacts([("nominal", 1.0)])
    lineage = LineageRecorder(mlflow_server)
    run = lineage.start_run("mm-unit-vision-exp", "promote")
    model = policy_model(unpacked, tar, report, bundle)
    warned = _Collect()
    logger = logging.getLogger("mlflow")
    logger.addHandler(warned)
    try:
        version = lineage.register_policy(VISION_NAME, model, run.run_id, {})
    finally:
        logger.removeHandler(warned)
    lineage.end_run(run.run_id)
    lineage.set_alias(VISION_NAME, "champion", version)
    return Registered(lineage, version, tar, onnx_path, report, bundle), warned.records


class _Collect(logging.Handler):
    """Keeps every record of WARNING and above."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_pyfunc_and_onnx_flavor_load_the_champion_and_match_onnx_runtime(
    registered: Registered,
) -> None:
    import mlflow.onnx
    import mlflow.pyfunc
    import onnxruntime as ort

    uri = f"models:/{NAME}@champion"
    obs = np.random.default_rng(7).normal(size=(64, OBS_DIM)).astype(np.float32)
    session = ort.InferenceSession(str(registered.onnx_path), providers=["CPUExecutionProvider"])
    want = session.run(["actions"], {"obs": obs})[0]
    pyfunc = mlflow.pyfunc.load_model(uri)
    got = pyfunc.predict(obs)
    assert set(got) == {"actions"}
    assert got["actions"].shape == (64, ACT_DIM)
    assert np.abs(got["actions"] - want).max() <= 1e-6
    proto = mlflow.onnx.load_model(uri)
    assert [i.name for i in proto.graph.input] == ["obs"]
    assert [o.name for o in proto.graph.output] == ["actions"]


def test_signature_and_input_example_name_obs_and_actions(registered: Registered) -> None:
    import mlflow.models

    info = mlflow.models.get_model_info(f"models:/{NAME}@champion")
    inputs, outputs = info.signature.inputs.to_dict(), info.signature.outputs.to_dict()
    assert inputs == [{"type": "tensor", "name": "obs",
                       "tensor-spec": {"dtype": "float32", "shape": (-1, OBS_DIM)}}]
    assert outputs == [{"type": "tensor", "name": "actions",
                        "tensor-spec": {"dtype": "float32", "shape": (-1, ACT_DIM)}}]
    example = mlflow.models.Model.load(f"models:/{NAME}@champion").load_input_example()
    assert isinstance(example, dict), example
    calibration = np.random.default_rng(1).normal(size=(16, OBS_DIM)).astype(np.float32)
    assert set(example) == {"obs"}
    np.testing.assert_array_equal(example["obs"], calibration[:2])


def test_a_state_bundle_has_no_image_inputs(registered: Registered, tmp_path: Path) -> None:
    unpacked, tar, _ = pack(tmp_path)
    model = policy_model(unpacked, tar, registered.report, registered.bundle)
    assert dict(model.images) == {}
    assert isinstance(model.input_example, np.ndarray)
    assert model.input_example.shape == (2, OBS_DIM)


def test_a_chunk_bundle_declares_its_actions_chunk_by_chunk(
    registered: Registered, tmp_path: Path
) -> None:
    from dataclasses import replace

    from stages.tracking.mlflow_model import _chunk_size, signature

    unpacked, tar, _ = pack(tmp_path)
    model = policy_model(unpacked, tar, registered.report, registered.bundle)
    assert model.chunk_size == 1
    assert signature(model).outputs.to_dict()[0]["tensor-spec"]["shape"] == (-1, ACT_DIM)
    chunked = replace(model, chunk_size=10)
    assert signature(chunked).outputs.to_dict()[0]["tensor-spec"]["shape"] == (-1, 10, ACT_DIM)
    assert _chunk_size({"io": {"chunk": {"size": 10, "ensemble": 0.01}}}) == 10
    assert _chunk_size({"io": {}}) == 1


def test_a_vision_input_example_without_rows_of_every_input_is_one_row_of_zeros(
    tmp_path: Path,
) -> None:
    (tmp_path / "calibration").mkdir()
    np.save(tmp_path / "calibration" / "obs.npy", np.ones((4, OBS_DIM), np.float32))
    np.save(tmp_path / "calibration" / "small.npy", np.ones((4, 4, 4, 3), np.uint8))
    for inputs in ({"obs": "calibration/obs.npy"},
                   {"obs": "calibration/obs.npy", IMAGE: "calibration/small.npy"}):
        manifest = {"engine": {"calibration": {"member": "calibration/obs.npy",
                                               "inputs": inputs}}}
        got = input_example(tmp_path, manifest, OBS_DIM, {IMAGE: FRAME})
        assert isinstance(got, dict) and set(got) == {"obs", IMAGE}
        assert got["obs"].dtype == np.float32 and got["obs"].shape == (1, OBS_DIM)
        assert got[IMAGE].dtype == np.uint8 and got[IMAGE].shape == (1, *FRAME)
        assert not got["obs"].any() and not got[IMAGE].any()


def test_a_vision_signature_names_obs_and_every_image(
    registered_vision: tuple[Registered, list[logging.LogRecord]],
) -> None:
    import mlflow.models

    info = mlflow.models.get_model_info(f"models:/{VISION_NAME}@champion")
    assert info.signature.inputs.to_dict() == [
        {"type": "tensor", "name": "obs",
         "tensor-spec": {"dtype": "float32", "shape": (-1, OBS_DIM)}},
        {"type": "tensor", "name": IMAGE,
         "tensor-spec": {"dtype": "uint8", "shape": (-1, *FRAME)}}]
    assert info.signature.outputs.to_dict() == [
        {"type": "tensor", "name": "actions",
         "tensor-spec": {"dtype": "float32", "shape": (-1, ACT_DIM)}}]
    refused = [r.getMessage() for r in registered_vision[1]
               if "serving input" in r.getMessage() or "missing from input" in r.getMessage()]
    assert not refused, refused


def test_a_vision_input_example_holds_calibration_rows_of_every_input(
    registered_vision: tuple[Registered, list[logging.LogRecord]],
) -> None:
    import mlflow.models

    example = mlflow.models.Model.load(f"models:/{VISION_NAME}@champion").load_input_example()
    assert isinstance(example, dict), example
    assert set(example) == {"obs", IMAGE}
    calibration = vision_calibration()
    np.testing.assert_array_equal(example["obs"], calibration["obs"][:2])
    np.testing.assert_array_equal(np.asarray(example[IMAGE]), calibration[IMAGE][:2])


def test_a_vision_pyfunc_predicts_on_named_inputs_as_onnx_runtime_does(
    registered_vision: tuple[Registered, list[logging.LogRecord]],
) -> None:
    import mlflow.pyfunc
    import onnxruntime as ort

    registered = registered_vision[0]
    rng = np.random.default_rng(9)
    feed = {"obs": rng.normal(size=(32, OBS_DIM)).astype(np.float32),
            IMAGE: rng.integers(0, 256, (32, *FRAME), dtype=np.uint8)}
    session = ort.InferenceSession(str(registered.onnx_path), providers=["CPUExecutionProvider"])
    want = session.run(["actions"], feed)[0]
    pyfunc = mlflow.pyfunc.load_model(f"models:/{VISION_NAME}@champion")
    got = pyfunc.predict(feed)
    assert got["actions"].shape == (32, ACT_DIM)
    assert np.abs(got["actions"] - want).max() <= 1e-6
    dark = pyfunc.predict({**feed, IMAGE: np.zeros_like(feed[IMAGE])})["actions"]
    assert np.abs(dark - want).max() > 1e-3
    assert [spec.name for spec in pyfunc.metadata.get_input_schema().inputs] == ["obs", IMAGE]


def test_a_vision_model_serves_its_input_example(
    registered_vision: tuple[Registered, list[logging.LogRecord]],
) -> None:
    """The JSON body ``mlflow models serve`` takes, built from the input example and parsed
    against the signature as the scoring server parses it, scores to ONNX Runtime's actions."""
    import mlflow.models
    import mlflow.pyfunc
    import onnxruntime as ort
    from mlflow.pyfunc.scoring_server import infer_and_parse_data

    uri = f"models:/{VISION_NAME}@champion"
    body = mlflow.models.convert_input_example_to_serving_input(
        mlflow.models.Model.load(uri).load_input_example())
    assert body is not None
    assert set(json.loads(body)["inputs"]) == {"obs", IMAGE}
    pyfunc = mlflow.pyfunc.load_model(uri)
    parsed = infer_and_parse_data(json.loads(body), pyfunc.metadata.get_input_schema())
    assert parsed[IMAGE].dtype == np.uint8 and parsed[IMAGE].shape == (2, *FRAME)
    got = pyfunc.predict(parsed)
    calibration = vision_calibration()
    session = ort.InferenceSession(str(registered_vision[0].onnx_path),
                                   providers=["CPUExecutionProvider"])
    want = session.run(["actions"], {k: v[:2] for k, v in calibration.items()})[0]
    assert np.abs(np.asarray(got["actions"]) - want).max() <= 1e-6


def test_bundle_and_manifest_travel_with_the_model(registered: Registered, tmp_path: Path) -> None:
    import mlflow.artifacts

    from edge.bundle import verify_bundle

    local = Path(mlflow.artifacts.download_artifacts(f"models:/{NAME}/{registered.version}",
                                                     dst_path=str(tmp_path)))
    tar = local / "extra_files" / BUNDLE_FILE
    digest = hashlib.sha256(registered.bundle_tar.read_bytes()).hexdigest()
    assert hashlib.sha256(tar.read_bytes()).hexdigest() == digest
    assert json.loads((local / "extra_files" / "manifest.json").read_text()) == verify_bundle(tar)
    assert {"MLmodel", "model.onnx", "requirements.txt"} <= {p.name for p in local.iterdir()}


def test_description_holds_the_gate_table(registered: Registered) -> None:
    mv = registered.lineage.client.get_model_version(NAME, registered.version)
    lines = str(mv.description).splitlines()
    assert lines[0].startswith("**Gates failed** - suite `tiny`")
    assert "| gate | measured | threshold | result |" in lines
    assert "| success/heavy payload (Wilson CI low) | 0 | 0.2 | **FAIL** |" in lines
    assert "| success/nominal (Wilson CI low) | 0.7 | 0.2 | pass |" in lines
    assert "| latency/p99_ms | 0.02 | 20 | pass |" in lines
    assert "| heavy payload | 8 | 2 | 0.250 [0.000, 0.350] |" in lines
    assert mv.tags["physai.gates_passed"] == "false"
    assert str(mv.source).startswith("models:/m-")


def test_the_logged_model_holds_the_scene_rates(registered: Registered) -> None:
    client = registered.lineage.client
    mv = client.get_model_version(NAME, registered.version)
    from mlflow.entities import LoggedModelStatus

    logged = client.get_logged_model(str(mv.source).removeprefix("models:/"))
    assert logged.status == LoggedModelStatus.READY
    assert logged.tags["mlflow.note.content"] == mv.description
    metrics = {m.key: m.value for m in logged.metrics or []}
    assert metrics == pytest.approx({
        "nominal/success_rate": 1.0, "nominal/ci_low": 0.7, "nominal/ci_high": 1.0,
        "heavy payload/success_rate": 0.25, "heavy payload/ci_low": 0.0,
        "heavy payload/ci_high": 0.35})


def test_experiments_are_model_training_experiments(registered: Registered) -> None:
    client = registered.lineage.client
    made = client.get_experiment_by_name("mm-unit-exp")
    assert made is not None
    assert made.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"
    old = client.create_experiment("mm-made-before")
    chosen = client.create_experiment("mm-genai", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    for name in ("mm-made-before", "mm-genai"):
        registered.lineage.experiment_id(name)
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


def test_a_long_gate_table_is_cut_to_the_limit_keeping_failed_gates_first() -> None:
    report, bundle = artifacts([(f"scene-{i:03d}", 0.1 if i % 7 else 0.9) for i in range(300)])
    text = gate_table(report, bundle, limit=5000)
    assert len(text) <= 5000
    rows = [line for line in text.splitlines() if line.startswith("| success/")]
    assert rows and all(row.endswith("**FAIL** |") for row in rows)
    skipped = len(report.gates) + len(bundle.gates) - len(rows)
    assert text.endswith(f"{skipped} more gates in the sim report {'d' * 12}")
    few_gates = report.model_copy(update={"gates": report.gates[:2]})
    text = gate_table(few_gates, bundle, limit=5000)
    assert len(text) <= 5000 and "| scene |" not in text
    assert text.endswith("Per-scene success rates: the logged model's metrics.")
    assert sum(line.startswith("| success/") for line in text.splitlines()) == 2
    short = gate_table(*artifacts([("a", 1.0)]))
    assert "| a | 8 | 8 | 1.000 [0.700, 1.000] |" in short
