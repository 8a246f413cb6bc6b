"""LeRobot's trainer as the train stage (tests/fixtures/lerobot_train_tiny.yaml): the pipeline's
pick-place demonstrations are written as a LeRobot v3 dataset, LeRobot's own training code runs
in the lerobot stage environment, and the trained ACT is brought in with its parity against
``select_action``, validated, packaged and promoted. Killed mid-training (SIGKILL, the whole
process group), a re-run resumes from the newest checkpoint the store holds. A key ACT's config
class does not know is one line at config load, before anything is written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.artifacts.records import Checkpoint, Dataset, Policy
from stages.storage.store import LocalStore
from tests.conftest import CliEnv
from tests.support import stage_python

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

pytestmark = pytest.mark.e2e


def tiny_config(tmp_path: Path, **train: Any) -> Path:
    """The tiny config in ``tmp_path`` with its paths made absolute and ``train`` set."""
    stage_python("lerobot")
    config = yaml.safe_load((FIXTURES / "lerobot_train_tiny.yaml").read_text())
    config["collect"]["scene"] = str((FIXTURES / config["collect"]["scene"]).resolve())
    config["validate"]["suite"] = str(FIXTURES / config["validate"]["suite"])
    config["train"].update(train)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def newest_checkpoint(refs: Path, store: LocalStore) -> Checkpoint | None:
    """The checkpoint the stage's reference names, once one is written."""
    ref = next((p for p in refs.glob("*") if not p.name.startswith(".tmp-")), None) \
        if refs.is_dir() else None
    if ref is None:
        return None
    artifact = store.get(ref.read_text().strip())
    assert isinstance(artifact, Checkpoint)
    return artifact


def test_a_killed_lerobot_training_resumes_and_its_policy_reaches_the_registry(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    from mlflow import MlflowClient

    tiny_config(tmp_path, steps=60)
    home = tmp_path / ".physai"
    env = cli_env(home)
    cmd = [sys.executable, "-m", "flows.cli", "run", "pipeline.yaml"]
    store = LocalStore(home / "store")
    refs = home / "store" / "refs" / "checkpoints" / "lerobot"
    victim = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    seen: Checkpoint | None = None
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and victim.poll() is None:
            seen = newest_checkpoint(refs, store)
            if seen is not None:
                break
            time.sleep(0.05)
    finally:
        os.killpg(victim.pid, signal.SIGKILL)  # the flow, LeRobot's trainer, everything
        victim.wait()
    assert seen is not None, "no checkpoint appeared before the deadline"
    assert victim.returncode == -signal.SIGKILL
    assert 10 <= seen.iteration < 60, seen.iteration

    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "models:/lerobot-train-tiny/1 -> @champion" in done.stdout, done.stdout[-3000:]
    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    version = client.get_model_version_by_alias("lerobot-train-tiny", "champion")
    policy = store.get(version.tags["physai.policy.digest"])
    assert isinstance(policy, Policy) and policy.algorithm == "lerobot"
    # Lineage: the demonstrations and the last checkpoint it was exported from.
    dataset, last = (store.get(d) for d in policy.parents)
    assert isinstance(dataset, Dataset) and dataset.episodes == 4
    assert isinstance(last, Checkpoint) and last.iteration == 60
    # Two attempts: the killed one, then the one that resumed from the newest checkpoint.
    assert len(policy.attempts) == 2 and policy.attempts[0] == seen.mlflow_run_id
    assert client.get_run(policy.attempts[0]).info.status == "KILLED"
    resumed = client.get_run(policy.attempts[1])
    start = int(resumed.data.tags["physai.resumed_from.iteration"])
    assert start >= seen.iteration
    losses = client.get_metric_history(policy.attempts[1], "loss")
    assert losses and min(m.step for m in losses) > start  # not trained again from step 0
    assert max(m.step for m in losses) == 60
    assert resumed.data.metrics["parity_max_abs_diff"] <= 1e-4
    assert resumed.data.params["policy"] == "act"
    assert resumed.data.params["policy.dim_model"] == "32"
    # Validated as LeRobot runs it (n_action_steps 4 of each chunk of 8), and so packaged.
    experiments = [e.experiment_id for e in client.search_experiments()]
    ran = {r.data.params["chunk"] for r in client.search_runs(experiments)
           if "chunk" in r.data.params}
    assert ran == {'{"execute": 4, "size": 8}'}, ran
    for manifest in (home / "store" / "artifacts").glob("*.json"):
        store.open_payload(store.get(manifest.stem))  # nothing half-written or corrupt


def test_a_key_acts_config_class_does_not_know_is_one_line_before_anything_runs(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    config = tiny_config(tmp_path, dim_modle=32)
    home = tmp_path / ".physai"
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", config.name],
                          cwd=tmp_path, env=cli_env(home), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "pipeline.yaml: train.dim_modle" in lines[0]
    assert "ACTConfig has no field of that name" in lines[0]
    assert not (home / "store" / "artifacts").exists() or \
        not any((home / "store" / "artifacts").iterdir())

    reserved = tiny_config(tmp_path, device="cpu", input_features={})
    done = subprocess.run([sys.executable, "-m", "flows.cli", "check", reserved.name],
                          cwd=tmp_path, env=cli_env(home), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "train.input_features" in done.stderr and "set by the stage" in done.stderr


DIFFUSION = {"algorithm": "lerobot", "policy": "diffusion", "steps": 20, "batch_size": 4,
             "save_freq": 10, "log_freq": 5, "cameras": ["front"], "device": "cpu",
             "n_obs_steps": 2, "horizon": 8, "n_action_steps": 4, "drop_n_last_frames": 3,
             "pretrained_backbone_weights": None, "use_group_norm": True,
             "crop_shape": [56, 56], "spatial_softmax_num_keypoints": 8, "down_dims": [16, 32],
             "kernel_size": 3, "n_groups": 4, "diffusion_step_embed_dim": 16,
             "num_inference_steps": 10}
"""A tiny DiffusionConfig: two frames of history, a horizon of 8, 4 actions a query."""


def test_a_diffusion_policy_trained_by_the_stage_reaches_the_robot_with_its_sampler(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    import json
    import tarfile

    from mlflow import MlflowClient

    path = tiny_config(tmp_path)
    config = yaml.safe_load(path.read_text())
    config["train"] = DIFFUSION
    config["package"]["denoising_steps"] = 5
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    home = tmp_path / ".physai"
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", path.name], cwd=tmp_path,
                          env=cli_env(home), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "models:/lerobot-train-tiny/1 -> @champion" in done.stdout, done.stdout[-3000:]
    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    (train,) = client.search_runs(experiments, "tags.`physai.algorithm` = 'lerobot'")
    assert train.data.params["lerobot_type"] == "diffusion"
    assert train.data.metrics["parity_max_abs_diff"] <= 1e-4
    def is_bundle(path: Path) -> bool:
        if not (path.is_file() and tarfile.is_tarfile(path)):
            return False
        with tarfile.open(path) as tar:
            return "manifest.json" in tar.getnames()

    (bundle,) = [p for p in (home / "store" / "objects").rglob("*") if is_bundle(p)]
    with tarfile.open(bundle) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        manifest = json.load(member)
    assert manifest["io"]["diffusion"]["steps"] == 5
    assert manifest["io"]["diffusion"]["n_obs_steps"] == 2
    assert manifest["io"]["chunk"] == {"size": 4, "execute": 4}
