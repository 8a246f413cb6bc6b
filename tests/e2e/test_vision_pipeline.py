"""A policy that sees, through every stage: camera images collected, DAgger rounds, a vision
policy trained, validated on rendered frames, packaged with its image input and promoted."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from stages.artifacts.records import Dataset, EdgeBundle, Policy
from stages.datasets.demonstrations import read_transitions
from stages.policies.local import load_actor
from stages.sim.tasks.catalog import get_task
from stages.storage.store import LocalStore

CliEnv = Callable[..., dict[str, str]]

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

pytestmark = pytest.mark.e2e


def test_vision_pipeline_with_dagger_rounds_in_the_lineage(tmp_path: Path,
                                                           cli_env: CliEnv) -> None:
    from mlflow import MlflowClient

    config = yaml.safe_load((FIXTURES / "reach_vision_tiny.yaml").read_text())
    config["collect"]["scene"] = str(FIXTURES / config["collect"]["scene"])
    config["validate"]["suite"] = str(FIXTURES / config["validate"]["suite"])
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    home = tmp_path / ".physai"
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", "pipeline.yaml"],
                          cwd=tmp_path, env=cli_env(home), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    uri = f"sqlite:///{home / 'mlflow.db'}"
    tags = MlflowClient(uri, registry_uri=uri).get_model_version_by_alias(
        "reach-vision-tiny", "champion").tags
    store = LocalStore(home / "store")
    spec = get_task("reach-vision-v0")

    # the champion is the last DAgger round's student; each round's dataset holds the
    # previous one's episodes and the round's, and names the student that drove
    student = store.get(tags["physai.policy.digest"])
    assert isinstance(student, Policy)
    counts = []
    policy = student
    for _ in range(config["train"]["dagger"]["rounds"]):
        data, before = (store.get(d) for d in policy.parents)
        assert isinstance(data, Dataset) and data.producer.stage == "train"
        assert data.producer.stage_version.startswith("dagger")
        assert isinstance(before, Policy) and data.parents[1] == before.digest
        counts.append(data.episodes)
        frames = read_transitions(store.open_payload(data), spec.obs_dim, spec.act_dim,
                                  cameras=spec.cameras).images["front_image"]
        assert frames.shape[1:] == (64, 64, 3) and len(frames) == data.transitions
        policy = before
    first = store.get(policy.parents[0])
    assert isinstance(first, Dataset) and first.producer.stage == "collect"
    rounds = config["train"]["dagger"]
    assert counts[::-1] == [config["collect"]["episodes"] + rounds["episodes"] * (r + 1)
                            for r in range(rounds["rounds"])]

    # the student reads the camera; the bundle names its image input
    assert load_actor(store.open_payload(student)).inputs == ("obs", "front_image")  # type: ignore[attr-defined]
    bundle = store.get(tags["physai.bundle.digest"])
    assert isinstance(bundle, EdgeBundle)
    with tarfile.open(store.open_payload(bundle)) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("manifest.json"))
        handle = tar.extractfile(member)
        assert handle is not None
        manifest = json.loads(handle.read())
    text = json.dumps(manifest)
    assert "front_image" in text and "uint8" in text.lower()

    # the registered MLflow model's signature names the image input too
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    info = mlflow.models.get_model_info("models:/reach-vision-tiny@champion")
    assert info.signature is not None
    assert info.signature.inputs.input_names() == ["obs", "front_image"]
