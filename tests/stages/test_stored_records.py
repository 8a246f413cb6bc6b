"""Records written before the move into concept folders still load with today's code.

``tests/fixtures/stored/`` holds what the code of commit 875100d wrote (its README has the
script): every stage's result as Prefect's result storage keeps a JSON result (the class named
by its old path, ``stages.artifacts.<Class>``), and a policy registered in MLflow by the old
``stages.mlflow_model.log_onnx_model`` (its ``MLmodel``, the ONNX network, the input example
and the signed bundle it carries). Prefect's JSON decoder turns a class path it cannot import
into a plain dict without a word, so each result is checked to come back as today's class,
with every field it was written with.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from stages.artifacts import records
from stages.orchestration.stage_table import STAGES, stage_def

STORED = Path(__file__).resolve().parents[1] / "fixtures" / "stored"
PREFECT = STORED / "prefect"
MLFLOW = STORED / "mlflow"
SCENE_STAGE = "validate-scene"
"""The per-scene task's results: one scene of the validate stage."""
OLD_CLASSES = {"collect": "Dataset", "teacher": "Policy", "train": "Policy",
               SCENE_STAGE: "SceneResult", "validate": "SimReport", "package": "EdgeBundle",
               "promote": "Promotion"}
"""The class each stage of the table at 875100d returned, by stage
(``stages.artifacts.<Class>``)."""


def result_type(stage: str) -> type[Any]:
    """Today's class of ``stage``'s result, from the stage table."""
    return records.SceneResult if stage == SCENE_STAGE else stage_def(stage).result_type


def kept(old: object, new: object, where: str = "") -> list[str]:
    """Where ``new`` lost or changed a value of ``old`` (mappings compared on ``old``'s keys:
    a field added since may hold its default)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        return [p for k, v in old.items()
                for p in ([f"{where}.{k}: gone"] if k not in new
                          else kept(v, new[k], f"{where}.{k}"))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (a, b) in enumerate(zip(old, new, strict=True))
                for p in kept(a, b, f"{where}[{i}]")]
    return [] if old == new else [f"{where}: {old!r} became {new!r}"]


def _stored(stage: str) -> tuple[bytes, dict[str, Any]]:
    """The stored result file's bytes and its result as the serializer wrote it."""
    blob = (PREFECT / f"{stage}.json").read_bytes()
    written: dict[str, Any] = json.loads(json.loads(blob)["result"])
    return blob, written


def test_every_stage_that_stored_a_result_is_still_in_the_table() -> None:
    """A stage of the old table (every one has a stored result) keeps its name, so a cached
    result of it is still found and read as its result type."""
    assert {p.stem for p in PREFECT.glob("*.json")} == set(OLD_CLASSES)
    assert set(OLD_CLASSES) <= {s.name for s in STAGES} | {SCENE_STAGE}


@pytest.mark.parametrize("stage", sorted(OLD_CLASSES))
def test_a_prefect_result_written_before_the_move_loads_as_todays_class(stage: str) -> None:
    from prefect.results import ResultRecord

    blob, written = _stored(stage)
    assert written["__class__"] == f"stages.artifacts.{OLD_CLASSES[stage]}"
    loaded: Any = ResultRecord.deserialize(blob).result
    assert type(loaded) is result_type(stage), f"loaded as {type(loaded).__name__}"
    assert type(loaded).__module__ == "stages.artifacts.records"
    assert kept(written["data"], loaded.model_dump(mode="json")) == []
    if isinstance(loaded, records.ArtifactBase):
        assert loaded.digest == hashlib.sha256(stage.encode()).hexdigest()
        assert loaded.producer.code_revision.startswith("875100d")


def test_a_scene_result_keeps_its_nested_records() -> None:
    from prefect.serializers import JSONSerializer

    blob, _ = _stored("validate")
    report = JSONSerializer().loads(json.loads(blob)["result"].encode())
    assert isinstance(report, records.SimReport)
    heavy = report.scenes[1]
    assert isinstance(heavy.critic, records.CriticVerdict)
    assert isinstance(heavy.sequential, records.SequentialVerdict)
    assert [type(f) for f in heavy.factors] == [records.FactorEffect]
    assert heavy.failure_modes == {"missed": 4, "fell": 1}
    assert report.sim_to_sim is not None and report.sim_to_sim.agreement[0].agrees
    assert report.sweeps[0].points[0].sweep == {"mass_scale": 2.0}
    assert [g.passed for g in report.gates] == [True, False]


def test_a_class_path_that_does_not_resolve_loads_as_a_plain_dict() -> None:
    """What the checks above stand guard against: Prefect's decoder gives up quietly."""
    from prefect.results import ResultRecord

    blob, _ = _stored("collect")
    moved = blob.replace(b"stages.artifacts.Dataset", b"stages.dataset_records.Dataset")
    loaded: object = ResultRecord.deserialize(moved).result
    assert isinstance(loaded, dict)
    assert loaded["__class__"] == "stages.dataset_records.Dataset"


# -- the MLflow model the old promote stage registered

@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A copy of the stored MLflow model's folder (MLflow's loaders may write beside it)."""
    return Path(shutil.copytree(MLFLOW / "model", tmp_path / "model"))


def _expected() -> dict[str, Any]:
    found: dict[str, Any] = json.loads((MLFLOW / "expected.json").read_text())
    return found


def test_every_module_the_mlmodel_names_imports(model: Path) -> None:
    import importlib

    spec = yaml.safe_load((model / "MLmodel").read_text())
    modules = [flavor["loader_module"] for flavor in spec["flavors"].values()
               if "loader_module" in flavor]
    assert modules == ["mlflow.onnx"]
    for module in modules:
        importlib.import_module(module)
    assert spec["flavors"]["onnx"]["data"] == "model.onnx"
    assert spec["metadata"]["physai.bundle.digest"] == _expected()["bundle_digest"]
    assert spec["metadata"]["physai.sim_report.digest"] == _expected()["report_digest"]


def test_mlflows_loaders_give_the_stored_actions(model: Path) -> None:
    import mlflow.models
    import mlflow.onnx
    import mlflow.pyfunc

    expected = _expected()
    obs = np.asarray(expected["obs"], dtype=np.float32)
    got = mlflow.pyfunc.load_model(str(model)).predict(obs)
    assert np.abs(got["actions"] - np.asarray(expected["actions"])).max() <= 1e-6
    proto = mlflow.onnx.load_model(str(model))
    assert [i.name for i in proto.graph.input] == ["obs"]
    info = mlflow.models.Model.load(str(model))
    assert info.signature is not None
    assert [s["name"] for s in info.signature.inputs.to_dict()] == ["obs"]
    example = info.load_input_example(str(model))
    assert isinstance(example, dict)
    assert example["obs"].shape == (2, obs.shape[1])


def test_the_bundle_it_carries_opens_signed_and_whole(model: Path) -> None:
    from edge.bundle import open_bundle

    tar = model / "extra_files" / "bundle.tar"
    bundle = open_bundle(tar, trust_key=MLFLOW / "signing.pub", allow_unsigned=False)
    assert bundle.sha256 == _expected()["bundle_digest"]
    assert hashlib.sha256(tar.read_bytes()).hexdigest() == bundle.sha256


def test_todays_import_takes_its_onnx_flavor(model: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``train: {algorithm: import, source: models:/...}`` reads the model as written: MLflow's
    download is given the stored folder in place of a registry's."""
    import mlflow.artifacts

    from stages.training.import_sources import Where, source_file

    def download(**_: object) -> str:
        return str(model)

    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", download)
    where = Where(tmp_path / "pipeline.yaml", "train.source")
    path, uri = source_file("models:/stored-policy/1", tmp_path, where, "sqlite:///x.db",
                            tmp_path / "work")
    assert (path, uri) == (model / "model.onnx", "models:/stored-policy/1")
