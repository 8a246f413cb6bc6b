"""`flows deploy` and `flows worker`: checked Kubernetes Job manifests without a server, then
pools, deployments and a worker against a real Prefect server."""

from __future__ import annotations

import argparse
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from flows.deploy import register
from flows.deploy_apply import apply_plan
from flows.deploy_plan import NIGHTLY_FLOW, plan_deployments
from flows.k8s_templates import check_job_manifest
from physai_core.errors import ConfigError, PhysaiError, UnknownNameError
from stages.core.settings import embedded_environment, resolve_settings

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TEMPLATES = ROOT / "configs" / "k8s"


def parse(*argv: str) -> argparse.Namespace:
    """Arguments of ``flows deploy|worker ...`` as the ``flows`` command line parses them."""
    parser = argparse.ArgumentParser(prog="flows")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def run(*argv: str) -> str:
    """Run ``flows deploy|worker ...`` in this process; returns what it printed."""
    out = io.StringIO()
    args = parse(*argv)
    assert args.func(args, Console(file=out, width=200)) == 0
    return out.getvalue()


@pytest.fixture
def env(physai_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """State under ``physai_home``, set through monkeypatch so nothing outlives the test."""
    for key, value in embedded_environment(resolve_settings()).items():
        monkeypatch.setenv(key, value)
    for computer in ("DGX", "OVX", "JETSON"):
        monkeypatch.delenv(f"PHYSAI_POOL_{computer}", raising=False)
    return physai_home


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The folder deployments are made from and run in: the flows' code (a link to this
    checkout's) and the configs deployed."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "flows").symlink_to(ROOT / "flows", target_is_directory=True)
    return folder


@pytest.fixture
def ppo_gpu_config(project: Path) -> Path:
    """The tiny PPO config asking for 2 nodes x 4 GPUs, 32 cores and 256 GiB each."""
    data = yaml.safe_load((FIXTURES / "ppo_tiny.yaml").read_text())
    data["train"]["scene"] = str(ROOT / "sim_scenes" / "locomotion" / "train.yaml")
    data["validate"]["suite"] = str(FIXTURES / "locomotion_suite_tiny.yaml")
    data["train"]["resources"] = {"nodes": 2, "nproc_per_node": 4, "gpus_per_node": 4,
                                  "cpus_per_node": 32, "memory_gb": 256}
    path = project / "ppo_gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def manifests(output: str) -> dict[str, dict[str, Any]]:
    """The Job manifests a dry run printed, by their ``# CONFIG STAGE`` header."""
    docs = {}
    for part in output.split("\n---\n")[1:]:
        header = part.splitlines()[0]
        docs[" ".join(header.split()[1:3])] = yaml.safe_load(part)
    return docs


def test_dry_run_prints_valid_v1job_manifests_with_the_gpu_request(
        env: Path, ppo_gpu_config: Path) -> None:
    from kubernetes.client import ApiClient

    out = run("deploy", "--dry-run", "--kubernetes", "--templates", str(TEMPLATES),
              "--project-dir", str(ppo_gpu_config.parent), str(ppo_gpu_config))
    assert "no server contacted" in out
    assert _statuses(out.split("\n---\n")[0])["engine-build/jetson"] == "planned"
    jobs = manifests(out)
    assert set(jobs) == {f"{ppo_gpu_config} {s}" for s in
                         ("train", "validate", "package", "promote")}

    class Response:
        def __init__(self, manifest: dict[str, Any]) -> None:
            self.data = json.dumps(manifest)

    for name, manifest in jobs.items():
        assert check_job_manifest(manifest, name) == []
        ApiClient().deserialize(Response(manifest), "V1Job")

    train = ApiClient().deserialize(Response(jobs[f"{ppo_gpu_config} train"]), "V1Job")
    assert (train.spec.parallelism, train.spec.completions) == (2, 2)
    assert train.spec.completion_mode == "Indexed"
    container = train.spec.template.spec.containers[0]
    assert container.resources.limits == {"nvidia.com/gpu": "4", "cpu": "32", "memory": "256Gi"}
    assert container.resources.requests == {"cpu": "32", "memory": "256Gi"}
    assert container.args[:3] == ["python", "-m", "torch.distributed.run"]
    assert container.args[container.args.index("--nproc-per-node") + 1] == "4"
    assert train.spec.template.spec.tolerations[0].key == "nvidia.com/gpu"

    validate = jobs[f"{ppo_gpu_config} validate"]["spec"]["template"]["spec"]
    assert validate["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert validate["containers"][0]["args"] == ["prefect", "flow-run", "execute"]
    package = jobs[f"{ppo_gpu_config} package"]["spec"]["template"]["spec"]
    assert package["nodeSelector"]["kubernetes.io/arch"] == "arm64"


def _unknown_field(text: str) -> tuple[str, str, str]:
    return (text.replace("              resources:\n", "              resource:\n"),
            "spec.template.spec.containers[0].resource", "unknown field of V1Container")


def _not_a_quantity(text: str) -> tuple[str, str, str]:
    return (text.replace('nvidia.com/gpu: "{{ gpus_per_node }}"',
                         'nvidia.com/gpu: "{{ gpus_per_node }} GPUs"'),
            "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]", "'4 GPUs'")


def _no_containers(text: str) -> tuple[str, str, str]:
    return (text.replace("          containers:\n", "          container:\n"),
            "spec.template.spec.containers", "required field of V1PodSpec is missing")


@pytest.mark.parametrize("breakage", [_unknown_field, _not_a_quantity, _no_containers])
def test_broken_template_is_one_line_error_naming_file_and_field(
        env: Path, ppo_gpu_config: Path, tmp_path: Path, breakage: Any) -> None:
    templates = tmp_path / "k8s"
    shutil.copytree(TEMPLATES, templates)
    dgx = templates / "dgx.yaml"
    broken, field, expected = breakage(dgx.read_text())
    assert broken != dgx.read_text()
    dgx.write_text(broken)
    with pytest.raises(ConfigError) as caught:
        run("deploy", "--dry-run", "--kubernetes", "--templates", str(templates),
            "--project-dir", str(ppo_gpu_config.parent), str(ppo_gpu_config))
    message = str(caught.value)
    assert caught.value.exit_code == 2
    assert "\n" not in message
    assert f"{dgx}: {field}:" in message
    assert expected in message


def test_bad_schedule_is_a_config_error(env: Path, ppo_gpu_config: Path) -> None:
    with pytest.raises(ConfigError, match="--nightly-cron") as caught:
        plan_deployments([ppo_gpu_config], project_dir=ppo_gpu_config.parent,
                         nightly_cron="0 25 * * *")
    assert caught.value.exit_code == 2


def test_worker_rejects_an_unknown_pool_and_needs_a_server(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'dgx'") as caught:
        run("worker", "dgz")
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)
    monkeypatch.setenv("PREFECT_API_URL", "")
    with pytest.raises(PhysaiError, match="flows server up"):
        run("worker", "ovx", "--run-once")


@pytest.fixture
def server(env: Path, prefect_api: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    return prefect_api


def _statuses(out: str) -> dict[str, str]:
    """Name -> status column of the printed table."""
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines()
            if line.startswith("│")]
    return {row[1]: row[4] for row in rows}


def test_deploy_creates_pools_and_deployments_once(
        server: str, ppo_gpu_config: Path, tiny_config: Any) -> None:
    from prefect import get_client

    reach = tiny_config("project/reach.yaml")
    project = reach.parent
    argv = ("deploy", "--no-dispatch", "--project-dir", str(project), "--nightly-cron",
            "30 3 * * 1-5",
            "--timezone", "Europe/Berlin", str(reach), str(ppo_gpu_config))
    first = _statuses(run(*argv))
    assert first == {name: "created" for name in (
        "dgx", "ovx", "jetson", "pipeline/reach", "pipeline/ppo_gpu", f"{NIGHTLY_FLOW}/reach",
        f"{NIGHTLY_FLOW}/ppo_gpu", "engine-build/jetson")}

    def held() -> dict[str, Any]:
        with get_client(sync_client=True) as client:
            pools = {p.name: (p.id, p.type) for p in client.read_work_pools()
                     if p.name in ("dgx", "ovx", "jetson")}
            nightly = client.read_deployment_by_name(f"{NIGHTLY_FLOW}/reach")
            reach_d = client.read_deployment_by_name("pipeline/reach")
            ppo_d = client.read_deployment_by_name("pipeline/ppo_gpu")
            engine = client.read_deployment_by_name("engine-build/jetson")
        return {"pools": pools, "nightly": nightly, "reach": reach_d, "ppo": ppo_d,
                "engine": engine}

    before = held()
    assert {n: t for n, (_, t) in before["pools"].items()} == {
        "dgx": "process", "ovx": "process", "jetson": "process"}
    nightly = before["nightly"]
    assert nightly.entrypoint == "flows/nightly.py:nightly_regression"
    assert nightly.work_pool_name == "ovx"
    assert nightly.parameters == {"config_path": "reach.yaml"}
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in nightly.schedules] == [
        ("30 3 * * 1-5", "Europe/Berlin", True)]
    assert nightly.global_concurrency_limit.limit == 1
    assert nightly.concurrency_options.collision_strategy.value == "CANCEL_NEW"
    ppo = before["ppo"]
    assert ppo.work_pool_name == "dgx" and ppo.entrypoint == "flows/pipeline.py:pipeline_flow"
    assert ppo.parameters == {"config_path": "ppo_gpu.yaml"}
    assert ppo.job_variables == {"env": {}}
    assert ppo.pull_steps == [{"prefect.deployments.steps.set_working_directory":
                               {"directory": str(project)}}]
    assert before["reach"].job_variables == {"env": {}}  # one process: every CPU it sees
    engine = before["engine"]
    assert (engine.work_pool_name, engine.entrypoint) == ("jetson",
                                                          "flows/engine.py:engine_build_flow")
    assert engine.parameter_openapi_schema["required"] == ["bundle_digest"]

    second = _statuses(run(*argv))
    assert set(second.values()) == {"unchanged"}
    after = held()
    assert after["pools"] == before["pools"]
    for key in ("nightly", "reach", "ppo", "engine"):
        assert after[key].id == before[key].id
        assert after[key].updated == before[key].updated
    assert [s.id for s in after["nightly"].schedules] == [s.id for s in nightly.schedules]

    changed = list(argv)
    changed[changed.index("30 3 * * 1-5")] = "0 2 * * *"
    third = _statuses(run(*changed))
    assert third[f"{NIGHTLY_FLOW}/reach"] == third[f"{NIGHTLY_FLOW}/ppo_gpu"] == "updated"
    assert {v for k, v in third.items() if not k.startswith(NIGHTLY_FLOW)} == {"unchanged"}
    now = held()["nightly"]
    assert now.id == nightly.id
    assert [s.schedule.cron for s in now.schedules] == ["0 2 * * *"]


def test_kubernetes_pools_hold_the_templates(
        server: str, ppo_gpu_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect import get_client

    for computer in ("dgx", "ovx", "jetson"):
        monkeypatch.setenv(f"PHYSAI_POOL_{computer.upper()}", f"k8s-{computer}")
    plan = plan_deployments([ppo_gpu_config], kubernetes=True, templates=TEMPLATES,
                            project_dir=ppo_gpu_config.parent, dispatch=False)
    with get_client(sync_client=True) as client:
        created = apply_plan(plan, client)
        again = apply_plan(plan, client)
        pool = client.read_work_pool("k8s-dgx")
        ppo = client.read_deployment_by_name("pipeline/ppo_gpu")
    assert [o.action for o in created if o.kind == "work pool"] == ["created"] * 3
    assert {o.action for o in again} == {"unchanged"}
    assert [o.id for o in again] == [o.id for o in created]
    assert pool.type == "kubernetes"
    assert pool.base_job_template == yaml.safe_load((TEMPLATES / "dgx.yaml").read_text())
    assert ppo.work_pool_name == "k8s-dgx"
    assert ppo.job_variables == {"nproc_per_node": 4, "gpus_per_node": 4, "cpu": 32,
                                 "memory": "256Gi", "env": {}}


def test_worker_runs_a_deployed_pipeline(
        server: str, project: Path, tiny_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect import get_client
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    monkeypatch.setenv("PHYSAI_POOL_DGX", "dgx-worker-test")
    config = tiny_config("project/worker.yaml", validate={"video_episodes": 0})
    run("deploy", "--no-dispatch", "--project-dir", str(project), str(config))
    flow_run = run_deployment("pipeline/worker", timeout=0)
    assert isinstance(flow_run, FlowRun)
    run("worker", "dgx-worker-test", "--run-once")
    with get_client(sync_client=True) as client:
        done = client.read_flow_run(flow_run.id)
    assert done.state is not None and done.state.is_completed(), done.state
    assert done.parameters == {"config_path": "worker.yaml"}


SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"
CREDENTIALS = f"aws_access_key_id: AKIAIOSFODNN7EXAMPLE\naws_secret_access_key: {SECRET}\n"


def test_a_deployment_refuses_a_config_outside_its_project_folder(
        server: str, project: Path, tiny_config: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Whoever may start a flow run names any ``config_path``; a worker reads only configs
    inside the project folder the deployment runs in: an absolute path elsewhere, a ``..``
    escape and a link pointing out are refused in one line, the file never read."""
    from prefect import get_client
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    for computer in ("DGX", "OVX"):
        monkeypatch.setenv(f"PHYSAI_POOL_{computer}", "trust-worker-test")
    config = tiny_config("project/trusted.yaml")
    run("deploy", "--no-dispatch", "--project-dir", str(project), str(config))
    secret = tmp_path / "credentials.yaml"
    secret.write_text(CREDENTIALS)
    (project / "link.yaml").symlink_to(secret)
    runs = [run_deployment(name, parameters={"config_path": path}, timeout=0)
            for name, path in (("pipeline/trusted", str(secret)),
                               ("pipeline/trusted", "../credentials.yaml"),
                               ("pipeline/trusted", "link.yaml"),
                               (f"{NIGHTLY_FLOW}/trusted", str(secret)))]
    flow_runs = [r for r in runs if isinstance(r, FlowRun)]
    assert len(flow_runs) == len(runs)
    run("worker", "trust-worker-test", "--run-once")
    with get_client(sync_client=True) as client:
        states = [client.read_flow_run(r.id).state for r in flow_runs]
    for state in states:
        assert state is not None and state.is_failed(), state
        assert "leads outside the project folder" in str(state.message), state.message
        assert SECRET not in str(state.message)
    out, err = capfd.readouterr()
    assert "leads outside the project folder" in out + err
    assert SECRET not in out + err and "aws_secret_access_key" not in out + err


def test_deploy_refuses_a_config_outside_the_project_folder(
        env: Path, project: Path, tiny_config: Any) -> None:
    outside = tiny_config("elsewhere.yaml")
    with pytest.raises(ConfigError) as caught:
        run("deploy", "--dry-run", "--project-dir", str(project), str(outside))
    message = str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in message
    assert f"{outside}: outside the project folder {project.resolve()}" in message


def test_project_config_refuses_every_way_out(project: Path, tmp_path: Path) -> None:
    from flows.stage_tasks import project_config

    secret = tmp_path / "credentials.yaml"
    secret.write_text(CREDENTIALS)
    (project / "configs").mkdir()
    (project / "configs" / "reach.yaml").write_text("name: reach\n")
    (project / "configs" / "link.yaml").symlink_to(secret)
    for inside in ("configs/reach.yaml", str(project / "configs" / "reach.yaml"),
                   "configs/../configs/reach.yaml"):
        assert project_config(inside, project) == inside
    for outside in (str(secret), "../credentials.yaml", "configs/../../credentials.yaml",
                    "configs/link.yaml", "/etc/passwd"):
        with pytest.raises(ConfigError) as caught:
            project_config(outside, project)
        message = str(caught.value)
        assert caught.value.exit_code == 2 and "\n" not in message
        assert "config_path: leads outside the project folder" in message
        assert SECRET not in message


def test_flows_run_here_reads_a_config_anywhere(tmp_path: Path) -> None:
    """Outside a deployment's run (``flows run``), a config may be anywhere."""
    from flows.stage_tasks import deployed_config

    assert deployed_config(str(tmp_path / "pipeline.yaml")) == str(tmp_path / "pipeline.yaml")


def test_default_plan_dispatches_each_stage_to_its_computer(
        env: Path, ppo_gpu_config: Path) -> None:
    plan = plan_deployments([ppo_gpu_config], project_dir=ppo_gpu_config.parent)
    by_name = {d.full_name: d for d in plan.deployments}
    for computer in ("dgx", "ovx", "jetson"):
        stage = by_name[f"stage/{computer}"]
        assert stage.work_pool == computer
        assert stage.entrypoint == "flows/dispatch.py:stage_flow"
        assert {"config_path", "stage", "run_id", "inputs"} <= set(
            stage.parameter_schema["properties"])
    pipeline = by_name["pipeline/ppo_gpu"]
    assert pipeline.work_pool == "ovx" and pipeline.job_variables == {}
    assert pipeline.parameters == {"config_path": "ppo_gpu.yaml", "dispatch": True}
