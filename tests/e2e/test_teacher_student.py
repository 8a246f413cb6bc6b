"""PPO teacher -> demonstrations -> behaviour-cloned student, through Prefect, in one chain."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from stages.artifacts.records import Dataset, Policy
from stages.datasets.demonstrations import read_transitions
from stages.policies.local import load_policy, policy_fn
from stages.storage.store import LocalStore

CliEnv = Callable[..., dict[str, str]]

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

pytestmark = pytest.mark.e2e


def test_teacher_student_pipeline_and_its_lineage(tmp_path: Path, cli_env: CliEnv) -> None:
    from mlflow import MlflowClient

    config = yaml.safe_load((FIXTURES / "student_tiny.yaml").read_text())
    scenes = ROOT / "sim_scenes" / "locomotion"
    config["teacher"]["scene"] = str(scenes / "train.yaml")
    config["collect"].update(scene=str(scenes / "flat.yaml"), exploration_noise=0.0)
    config["validate"]["suite"] = str(FIXTURES / "locomotion_suite_tiny.yaml")
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    home = tmp_path / ".physai"
    env = cli_env(home)

    def flows(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout + done.stderr

    out = flows("run", "pipeline.yaml")
    assert "Task run 'teacher" in out and "Task run 'collect" in out
    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    tags = client.get_model_version_by_alias("student-tiny", "champion").tags
    store = LocalStore(home / "store")
    student = store.get(tags["physai.policy.digest"])
    dataset = store.get(tags["physai.dataset.digest"])
    teacher = store.get(tags["physai.teacher.digest"])
    assert isinstance(student, Policy) and student.algorithm == "bc"
    assert isinstance(dataset, Dataset) and isinstance(teacher, Policy)
    assert teacher.algorithm == "ppo" and teacher.producer.stage == "teacher"
    assert student.parents == (dataset.digest,) and dataset.parents == (teacher.digest,)
    assert dataset.expert == teacher.digest

    # on a noise-free scene with no exploration noise, every label is the teacher's action
    data = read_transitions(store.open_payload(dataset), student.obs_dim, student.act_dim)
    act = policy_fn(load_policy(store.open_payload(teacher))[0])
    np.testing.assert_allclose(data.actions, act(data.obs), atol=1e-6)

    lineage = " ".join(flows("lineage", "models:/student-tiny@champion").split())
    for role, digest in (("policy", student.digest), ("dataset", dataset.digest),
                         ("teacher", teacher.digest)):
        assert f"{role} {digest} verified" in lineage
    assert f"teacher training run {teacher.mlflow_run_id}" in lineage
    assert lineage.index("policy") < lineage.index("dataset") < lineage.index("teacher")

    again = flows("run", "pipeline.yaml")
    assert "cached stages: teacher, collect, train, validate-scene, validate, package" in again
