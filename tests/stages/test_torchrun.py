"""The PPO stage under torchrun with two CPU processes (DDP over gloo): ranks stay in sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from stages.artifacts.records import Policy
from stages.pipeline.launch import torchrun_command
from stages.sections.models import Resources

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def test_torchrun_command_for_one_and_several_nodes(tmp_path: Path) -> None:
    one = torchrun_command(Resources(nproc_per_node=8, gpus_per_node=8),
                           tmp_path / "c.yaml", "train", tmp_path / "r.json", "run1")
    assert one[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert one[one.index("--nproc-per-node") + 1] == "8" and "--standalone" in one
    assert one[one.index("-m", 3) + 1] == "stages.pipeline.launch"
    assert one[-6:] == ["--stage", "train", "--result", str(tmp_path / "r.json"),
                        "--run-id", "run1"]
    many = torchrun_command(Resources(nodes=4, nproc_per_node=8), tmp_path / "c.yaml",
                            "teacher", rdzv_endpoint="head:29400")
    assert "--standalone" not in many
    assert many[many.index("--nnodes") + 1] == "4"
    assert many[many.index("--rdzv-endpoint") + 1] == "head:29400"


def test_several_nodes_without_rendezvous_is_an_error(tmp_path: Path) -> None:
    import pytest

    from physai_core.errors import PhysaiError

    with pytest.raises(PhysaiError, match="PHYSAI_RDZV_ENDPOINT"):
        torchrun_command(Resources(nodes=2), tmp_path / "c.yaml", "train")


def test_two_ranks_stay_in_sync(physai_home: Path, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    data = yaml.safe_load((FIXTURES / "ppo_tiny.yaml").read_text())
    data["train"].update(scene=str(ROOT / "sim_scenes" / "locomotion" / "train.yaml"),
                         iterations=3, num_worlds=32, checkpoint_every=2,
                         resources={"nproc_per_node": 2})
    data["validate"]["suite"] = str(FIXTURES / "locomotion_suite_tiny.yaml")
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(data))
    result = tmp_path / "policy.json"
    cmd = torchrun_command(Resources(nproc_per_node=2), config, "train", result)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[rank 0]" in done.stderr and "[rank 1]" in done.stderr
    policy = Policy.model_validate_json(result.read_text())
    uri = f"sqlite:///{physai_home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    run = client.get_run(str(policy.mlflow_run_id))
    assert run.data.params["world_size"] == "2"
    digests = run.data.tags["physai.rank_param_digests"].split(",")
    assert len(digests) == 2 and digests[0] == digests[1]
    # each rank stepped its own worlds: twice the transitions of one process per iteration
    sps = client.get_metric_history(run.info.run_id, "env_steps")
    assert max(m.value for m in sps) == 3 * 2 * 32 * data["train"]["steps_per_iteration"]
    assert json.loads(result.read_text())["algorithm"] == "ppo"
