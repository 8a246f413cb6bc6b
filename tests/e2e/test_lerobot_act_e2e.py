"""An ACT policy trained by LeRobot itself (tiny, on the CPU, from random weights, nothing
downloaded) through the whole pipeline: ``train: {source: FOLDER}`` exports it in the lerobot
stage environment and checks it against LeRobot's ``select_action``; it is validated on
reach-vision-v0's tiny suite as a chunk policy that sees, packaged with its camera input and
its chunk spec, and promoted. The gates are opened (tests/fixtures/lerobot_act_tiny.yaml): an
untrained ACT almost never reaches; the path is what is tested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import CliEnv
from tests.support import stage_python

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

pytestmark = pytest.mark.e2e


def test_a_lerobot_act_policy_is_imported_validated_packaged_and_promoted(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    import mlflow
    from mlflow import MlflowClient

    python = stage_python("lerobot")
    trained = subprocess.run(
        [str(python), str(FIXTURES / "lerobot_act.py"), str(tmp_path / "act")],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}, capture_output=True,
        text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    config = yaml.safe_load((FIXTURES / "lerobot_act_tiny.yaml").read_text())
    config["validate"]["suite"] = str(FIXTURES / config["validate"]["suite"])
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    home = tmp_path / ".physai"
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", "pipeline.yaml"],
                          cwd=tmp_path, env=cli_env(home), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    promoted = [line for line in done.stdout.splitlines() if "models:/lerobot-act-tiny/" in line]
    assert promoted and "models:/lerobot-act-tiny/1 -> @champion" in promoted[0], (
        promoted or done.stdout[-3000:])

    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    version = client.get_model_version_by_alias("lerobot-act-tiny", "champion")
    train = client.get_run(version.tags["physai.train_run_id"])
    assert train.data.tags["physai.source.kind"] == "lerobot"
    assert train.data.params["lerobot_version"] == "0.6.1"
    assert train.data.params["lerobot_type"] == "act"
    assert train.data.metrics["parity_max_abs_diff"] <= 1e-4
    assert train.data.metrics["parity_chunk_max_abs_diff"] <= 1e-4

    bundle = next((home / "store" / "objects").glob(f"*/{version.tags['physai.bundle.digest']}"))
    with tarfile.open(bundle) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("manifest.json"))
        handle = tar.extractfile(member)
        assert handle is not None
        manifest = json.loads(handle.read())
    io = manifest["io"]
    assert io["chunk"] == {"size": 10, "execute": 10}
    assert [image["name"] for image in io["images"]] == ["front_image"]
    import mlflow.models

    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    info = mlflow.models.get_model_info(f"models:/lerobot-act-tiny/{version.version}")
    assert info.signature.outputs.to_dict()[0]["tensor-spec"]["shape"] == (-1, 10, 7)
    print(f"\nLeRobot ACT: parity {train.data.metrics['parity_max_abs_diff']:.2g}, "
          f"LeRobot per query {train.data.metrics.get('lerobot_latency_ms_p50', 0):.1f} ms")
