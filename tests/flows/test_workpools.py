"""Stage resources reach the dgx work pool's job variables."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from flows.workpools import job_variables, work_pool
from stages.pipeline.config import load_pipeline

ROOT = Path(__file__).resolve().parents[2]


def test_training_resources_become_dgx_job_variables(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "configs" / "locomotion.yaml").read_text())
    data["train"]["scene"] = str(ROOT / "sim_scenes" / "locomotion" / "train.yaml")
    data["validate"]["suite"] = str(ROOT / "sim_scenes" / "locomotion" / "suite.yaml")
    data["train"]["resources"] = {"nodes": 2, "nproc_per_node": 8, "gpus_per_node": 8,
                                  "cpus_per_node": 64, "memory_gb": 512}
    path = tmp_path / "dgx.yaml"
    path.write_text(yaml.safe_dump(data))
    pipeline = load_pipeline(path)
    train = job_variables(pipeline, "train")
    assert train["work_pool"] == "dgx"
    v = train["job_variables"]
    assert (v["nodes"], v["nproc_per_node"], v["gpus_per_node"]) == (2, 8, 8)
    assert v["cpu"] == 64 and v["memory"] == "512Gi" and v["env"] == {}
    cmd = shlex.split(v["command"])
    assert cmd[:3] == ["python", "-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "8"
    assert cmd[cmd.index("--nnodes") + 1] == "2"
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "$(PHYSAI_RDZV_ENDPOINT)"
    assert cmd[cmd.index("stages.pipeline.launch") + 1] == str(path)
    validate = job_variables(pipeline, "validate")
    assert validate["work_pool"] == "ovx" and "command" not in validate["job_variables"]
    assert job_variables(pipeline, "package")["work_pool"] == "jetson"


def test_single_process_training_runs_in_place() -> None:
    v = job_variables(load_pipeline(ROOT / "configs" / "locomotion.yaml"), "train")
    assert v["job_variables"]["nproc_per_node"] == 1 and "command" not in v["job_variables"]
    # One process on CPUs uses every CPU its container sees, as the stage in-process does.
    assert v["job_variables"]["env"] == {}


@pytest.mark.parametrize(("resources", "env"), [
    ({}, {}),
    ({"nproc_per_node": 2}, {"OMP_NUM_THREADS": "1"}),
    ({"nproc_per_node": 2, "cpus_per_node": 16}, {"OMP_NUM_THREADS": "8"}),
    ({"cpus_per_node": 6}, {"OMP_NUM_THREADS": "6"}),
    ({"nproc_per_node": 4, "cpus_per_node": 2}, {"OMP_NUM_THREADS": "1"}),
    ({"gpus_per_node": 1, "cpus_per_node": 16}, {}),
])
def test_cpu_stages_share_the_cpus_they_ask_for(
    tmp_path: Path, resources: dict[str, int], env: dict[str, str]
) -> None:
    data = yaml.safe_load((ROOT / "configs" / "locomotion.yaml").read_text())
    data["train"]["scene"] = str(ROOT / "sim_scenes" / "locomotion" / "train.yaml")
    data["validate"]["suite"] = str(ROOT / "sim_scenes" / "locomotion" / "suite.yaml")
    data["train"]["resources"] = resources
    path = tmp_path / "cpus.yaml"
    path.write_text(yaml.safe_dump(data))
    assert job_variables(load_pipeline(path), "train")["job_variables"]["env"] == env


def test_pool_names_come_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHYSAI_POOL_DGX", "gpu-cluster-a")
    assert work_pool("dgx") == "gpu-cluster-a" and work_pool("ovx") == "ovx"
    with pytest.raises(KeyError, match="unknown computer"):
        work_pool("laptop")
