"""A PPO training stage killed mid-run (SIGKILL) resumes from its checkpoint on the re-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from stages.artifacts.records import Checkpoint, Policy
from stages.storage.store import LocalStore

CliEnv = Callable[..., dict[str, str]]

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

pytestmark = pytest.mark.e2e


def test_killed_training_resumes_from_its_last_checkpoint(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    from mlflow import MlflowClient

    config = yaml.safe_load((FIXTURES / "ppo_tiny.yaml").read_text())
    config["name"] = "ppo-kill"
    config["promote"]["model_name"] = "ppo-kill"
    config["train"].update(scene=str(ROOT / "sim_scenes" / "locomotion" / "train.yaml"),
                           iterations=24, num_worlds=128, checkpoint_every=4)
    config["validate"]["suite"] = str(FIXTURES / "locomotion_suite_tiny.yaml")
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    home = tmp_path / ".physai"
    env = cli_env(home)
    cmd = [sys.executable, "-m", "flows.cli", "run", "pipeline.yaml"]
    refs = home / "store" / "refs" / "checkpoints" / "ppo"
    store = LocalStore(home / "store")

    victim = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    seen: Checkpoint | None = None
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and victim.poll() is None:
            # A ref, not the store's temporary file of one being written (renamed away).
            ref = next((p for p in refs.glob("*") if not p.name.startswith(".tmp-")), None) \
                if refs.is_dir() else None
            if ref is not None:
                artifact = store.get(ref.read_text().strip())
                assert isinstance(artifact, Checkpoint)
                if artifact.iteration >= 8:
                    seen = artifact
                    break
            time.sleep(0.05)
    finally:
        os.killpg(victim.pid, signal.SIGKILL)  # the flow, its Prefect server, everything
        victim.wait()
    assert seen is not None, "no checkpoint appeared before the deadline"
    assert victim.returncode == -signal.SIGKILL

    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    version = client.get_model_version_by_alias("ppo-kill", "champion")
    policy = store.get(version.tags["physai.policy.digest"])
    assert isinstance(policy, Policy)
    assert len(policy.attempts) == 2 and policy.attempts[0] == seen.mlflow_run_id
    assert client.get_run(policy.attempts[0]).info.status == "KILLED"
    resumed = client.get_run(policy.attempts[1])
    start = int(resumed.data.tags["physai.resumed_from.iteration"])
    assert start >= seen.iteration  # the newest checkpoint, never an older one
    steps = [m.step for m in client.get_metric_history(policy.attempts[1], "steps_per_second")]
    assert min(steps) == start and max(steps) == 23  # lost at most the iterations since it
    assert version.tags["physai.train_attempts"] == ",".join(policy.attempts)

    lineage = subprocess.run([sys.executable, "-m", "flows.cli", "lineage",
                              "models:/ppo-kill@champion"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert lineage.returncode == 0, lineage.stdout + lineage.stderr
    flat = " ".join(lineage.stdout.split())
    assert f"attempts {policy.attempts[0]} then {policy.attempts[1]}" in flat
    for manifest in (home / "store" / "artifacts").glob("*.json"):
        store.open_payload(store.get(manifest.stem))  # nothing half-written or corrupt
