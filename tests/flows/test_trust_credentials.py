"""Credentials stay home: what travels to Ray tasks, Docker pools' job templates and image builds
is an allowlist of locations, URLs without their credentials; a credential asked to travel is
refused in one line naming the variable, not its value; containers get credentials from Prefect
Secret blocks the template names; pip settings reach a dependency build as a mounted file, never
``podman run -e``; error lines redact URL credentials (issue 42, item 6)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from physai_core.errors import ConfigError
from stages.core.redaction import redact_urls, strip_url_credentials
from stages.core.settings import embedded_environment, resolve_settings

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "hunter2-Pw9"
TOKEN = "tok3n-Zq7"
CREDENTIALS = (PASSWORD, TOKEN, "dbpass-Xy5", "admin:auth-Str1ng")
DRIVER_ENV = {
    "MLFLOW_TRACKING_URI": f"http://alice:{PASSWORD}@127.0.0.1:5000",
    "PREFECT_API_URL": f"http://127.0.0.1:4200/api?token={TOKEN}",
    "PREFECT_API_AUTH_STRING": "admin:auth-Str1ng",
    "PREFECT_API_DATABASE_CONNECTION_URL": "postgresql+asyncpg://prefect:dbpass-Xy5@db/prefect",
    "PHYSAI_STORE": "s3://bucket/prefix",
}
"""A driver's environment whose MLflow URI, Prefect API URL, Prefect auth string and Prefect
database URL each hold a credential (the cases of issue 42)."""


def _leaks(values: object) -> list[str]:
    text = json.dumps(values)
    return [c for c in CREDENTIALS if c in text]


# -- one helper redacts and strips URL credentials -------------------------------------------


@pytest.mark.parametrize(("text", "redacted", "stripped"), [
    ("postgresql+asyncpg://prefect:pw@db:5432/prefect?sslmode=require&sslpassword=x",
     "postgresql+asyncpg://<redacted>@db:5432/prefect?sslmode=require&sslpassword=<redacted>",
     "postgresql+asyncpg://db:5432/prefect?sslmode=require"),
    # A bare slash ends the host for a client, so stripping leaves it (and travel refuses it);
    # a message hides everything up to the last @.
    ("failed: 'https://__token__:p/w@d@idx.example/simple' (exit 1)",
     "failed: 'https://<redacted>@idx.example/simple' (exit 1)",
     "failed: 'https://__token__:p/w@d@idx.example/simple' (exit 1)"),
    ("see https://tok@github.com/a?x=1&access_token=abc#f and s3://bucket/key",
     "see https://<redacted>@github.com/a?x=1&access_token=<redacted>#f and s3://bucket/key",
     "see https://github.com/a?x=1#f and s3://bucket/key"),
    ("sqlite:////tmp/a.db", "sqlite:////tmp/a.db", "sqlite:////tmp/a.db"),
    ("file:///home/alice@corp.example/mlruns", "file:///home/alice@corp.example/mlruns",
     "file:///home/alice@corp.example/mlruns"),
    # A password holding a space or a quote, which SQLAlchemy accepts: a message hides it up
    # to the @ before the next / on its line; stripping leaves it (and travel refuses it).
    ("connect postgresql://u:pa ss-Pw9@db/x failed",
     "connect postgresql://<redacted>@db/x failed",
     "connect postgresql://u:pa ss-Pw9@db/x failed"),
    ("engine 'mysql://u:pa'ss-Pw9@db/x' refused\nsee http://h/x",
     "engine 'mysql://<redacted>@db/x' refused\nsee http://h/x",
     "engine 'mysql://u:pa'ss-Pw9@db/x' refused\nsee http://h/x"),
    # An @ past the next / or on another line ends nothing; only a URL without a path
    # followed by an @ on its line loses the words between (too much hidden, never too little).
    ("http://127.0.0.1:9/api does not answer; ask ops@corp.example",
     "http://127.0.0.1:9/api does not answer; ask ops@corp.example",
     "http://127.0.0.1:9/api does not answer; ask ops@corp.example"),
    ("http://127.0.0.1:9 does not answer\nask ops@corp.example",
     "http://127.0.0.1:9 does not answer\nask ops@corp.example",
     "http://127.0.0.1:9 does not answer\nask ops@corp.example"),
    ("http://127.0.0.1:9 does not answer; ask ops@corp.example",
     "http://<redacted>@corp.example",
     "http://127.0.0.1:9 does not answer; ask ops@corp.example"),
])
def test_url_credentials_are_redacted_and_stripped(text: str, redacted: str,
                                                   stripped: str) -> None:
    assert redact_urls(text) == redacted
    assert strip_url_credentials(text) == stripped


def test_error_lines_redact_url_credentials(
        tmp_path: Path, tiny_config: Callable[..., Path], cli_env: Callable[..., dict[str, str]]
) -> None:
    config = tiny_config()
    # A Prefect API that does not answer: the CLI's one error line names it, less its password.
    env = cli_env(tmp_path / ".physai", shared_prefect=False,
                  PREFECT_API_URL=f"http://alice:{PASSWORD}@127.0.0.1:9/api")
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "deploy", "--no-dispatch",
                           "--project-dir", str(config.parent), str(config)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "http://<redacted>@127.0.0.1:9/api does not answer" in proc.stderr
    assert _leaks(proc.stdout + proc.stderr) == []


def test_an_environment_problem_shows_no_url_credential() -> None:
    from stages.core.settings import check_environment

    with pytest.raises(ConfigError) as caught:
        check_environment({"MLFLOW_TRACKING_URI": f"mlflowx://alice:{PASSWORD}@host/",
                           "PHYSAI_STORE": f"gs://u:{PASSWORD}@bucket/prefix"})
    assert "unknown scheme 'mlflowx'" in str(caught.value)
    assert "mlflowx://<redacted>@host/" in str(caught.value)
    assert _leaks(str(caught.value)) == []


# -- Ray: the runtime environment every task carries ------------------------------------------


def test_ray_tasks_carry_locations_without_credentials(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.runners import worker_environment

    monkeypatch.chdir(tmp_path)
    travel = worker_environment({**DRIVER_ENV, "PHYSAI_HOME": "state"})
    assert _leaks(travel) == []
    assert travel["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    assert travel["PREFECT_API_URL"] == "http://127.0.0.1:4200/api"
    assert travel["PHYSAI_STORE"] == "s3://bucket/prefix"
    for stays in ("PREFECT_API_AUTH_STRING", "PREFECT_API_DATABASE_CONNECTION_URL"):
        assert stays not in travel
    # Only the allowlist travels: another of Prefect's settings stays too.
    assert "PREFECT_LOGGING_LEVEL" not in worker_environment({"PREFECT_LOGGING_LEVEL": "DEBUG"})


@pytest.mark.parametrize(("extra", "named"), [
    ({"PHYSAI_WORKER_ENV": "HF_HOME,PREFECT_API_AUTH_STRING"}, "PREFECT_API_AUTH_STRING"),
    ({"PHYSAI_WORKER_ENV": "PREFECT_API_KEY", "PREFECT_API_KEY": "pnu_" + "a" * 36},
     "PREFECT_API_KEY"),
    ({"PHYSAI_COSMOS_URL": "https://critic.example/ghp_" + "b" * 36}, "PHYSAI_COSMOS_URL"),
    ({"PHYSAI_WORKER_ENV": "HF_ENDPOINT", "HF_ENDPOINT": "https://h/hf_" + "C1" * 15},
     "HF_ENDPOINT"),
    # A password with a bare slash: what follows it is no host, and the rest may be password.
    ({"MLFLOW_TRACKING_URI": "http://alice:pass/word-Pw9@127.0.0.1:5000"},
     "MLFLOW_TRACKING_URI"),
])
def test_a_credential_asked_to_travel_is_refused_by_name(
        extra: dict[str, str], named: str) -> None:
    from flows.runners import worker_environment

    with pytest.raises(ConfigError) as caught:
        worker_environment({**DRIVER_ENV, "PHYSAI_HOME": "/srv/physai", **extra})
    message = str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in message
    assert f"environment: {named}: " in message
    assert [v for v in {**DRIVER_ENV, **extra}.values() if len(v) > 20 and v in message] == []
    assert _leaks(message) == []


@pytest.mark.parametrize("uri", [
    "postgresql://u:pa ss-Pw9@db/mlflow",  # SQLAlchemy reads the password "pa ss-Pw9"
    "postgresql://u:pa'ss-Pw9@db/mlflow",
    'postgresql://u:pa"ss-Pw9@db/mlflow',
    "postgresql://u:p s/s-Pw9@db/mlflow",  # and this one as "p s/s-Pw9", slash and all
    "http://u:pa\tss-Pw9@127.0.0.1:5000",
])
def test_a_password_holding_a_space_or_a_quote_does_not_travel(uri: str) -> None:
    from stages.core.settings import LOCATION_VARIABLES, travelling_environment

    with pytest.raises(ConfigError) as caught:
        travelling_environment({"MLFLOW_TRACKING_URI": uri, "PHYSAI_HOME": "/srv/physai"},
                               LOCATION_VARIABLES)
    message = str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in message
    assert message.startswith("environment: MLFLOW_TRACKING_URI: holds a credential")
    assert "Pw9" not in message


def test_an_at_in_a_path_travels() -> None:
    from stages.core.settings import LOCATION_VARIABLES, travelling_environment

    env = {"MLFLOW_TRACKING_URI": "file:///home/alice@corp.example/mlruns",
           "PHYSAI_MLFLOW_ARTIFACTS": "/srv/alice@corp/artifacts",
           "PHYSAI_HOME": "/srv/a b/physai", "PHYSAI_STORE": "s3://bucket/prefix"}
    assert travelling_environment(env, LOCATION_VARIABLES) == env


def test_a_variable_asked_to_travel_travels() -> None:
    from flows.runners import worker_environment

    travel = worker_environment({"PHYSAI_HOME": "/srv/physai", "PHYSAI_WORKER_ENV": "HF_HOME",
                                 "HF_HOME": "/srv/hf", "HF_TOKEN": "hf_secret"})
    assert travel["HF_HOME"] == "/srv/hf" and "HF_TOKEN" not in travel


def test_flows_run_refuses_a_credential_asked_to_travel_before_the_flow(
        tmp_path: Path, tiny_config: Callable[..., Path], cli_env: Callable[..., dict[str, str]]
) -> None:
    config = tiny_config()
    env = cli_env(tmp_path / ".physai", shared_prefect=False,
                  PHYSAI_WORKER_ENV="PREFECT_API_AUTH_STRING",
                  PREFECT_API_AUTH_STRING="admin:auth-Str1ng")
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(config),
                           "--task-runner", "ray"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flows: error: environment: "
                                                   "PREFECT_API_AUTH_STRING: ")
    assert _leaks(proc.stdout + proc.stderr) == []
    # A PHYSAI_ setting holding a token: refused as the Ray runner is made, before any run.
    env = {**env, "PHYSAI_WORKER_ENV": "", "PHYSAI_COSMOS_URL": "https://c/ghp_" + "d" * 36}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(config),
                           "--task-runner", "ray"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("flows: error: environment: PHYSAI_COSMOS_URL: ")
    assert "d" * 36 not in proc.stdout + proc.stderr
    assert not (tmp_path / ".physai" / "store").exists()


def test_a_local_ray_instance_holds_no_credential(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    pytest.importorskip("prefect_ray")
    import ray

    from flows.runners import RAY_OBJECT_STORE_BYTES, placed_ray_runner

    for key, value in {**DRIVER_ENV, "PHYSAI_HOME": str(tmp_path),
                       "RAY_AUTH_MODE": "disabled"}.items():
        monkeypatch.setenv(key, value)
    runner = placed_ray_runner()(init_kwargs={
        "num_cpus": 1, "include_dashboard": False, "object_store_memory": RAY_OBJECT_STORE_BYTES})
    with runner:
        held = ray.get_runtime_context().runtime_env
    assert held["env_vars"]["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    assert _leaks(held) == []


# -- Docker pools: the job template on the Prefect server -------------------------------------


def _deploy(*argv: str) -> str:
    from flows.deploy import register

    parser = argparse.ArgumentParser(prog="flows")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["deploy", *argv])
    out = io.StringIO()
    assert args.func(args, Console(file=out, width=200)) == 0
    return out.getvalue()


@pytest.fixture
def deploy_env(physai_home: Path, prefect_api: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A deploying process whose MLflow URI holds a password, against the module's server."""
    pytest.importorskip("prefect_docker")
    for key, value in embedded_environment(resolve_settings()).items():
        monkeypatch.setenv(key, value)
    for computer in ("DGX", "OVX", "JETSON"):
        monkeypatch.delenv(f"PHYSAI_POOL_{computer}", raising=False)
    for key, value in DRIVER_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    return physai_home


def test_docker_pools_hold_no_credential_and_render_them_from_secret_blocks(
        deploy_env: Path, tiny_config: Callable[..., Path]) -> None:
    from prefect import get_client
    from prefect.blocks.system import Secret
    from prefect_docker.worker import DockerWorkerJobConfiguration

    config = tiny_config("project/reach.yaml")
    argv = ("--docker", "--secret", "MLFLOW_TRACKING_PASSWORD=physai-mlflow-password",
            "--project-dir", str(config.parent), str(config))
    with pytest.raises(ConfigError, match=r"--secret: no Secret block .*'physai-mlflow-password'"):
        _deploy(*argv)
    with get_client(sync_client=True) as client:
        assert not [p for p in client.read_work_pools() if p.name in ("dgx", "ovx", "jetson")]
    Secret(value=PASSWORD).save("physai-mlflow-password", overwrite=True)
    _deploy(*argv)

    async def rendered(template: dict[str, Any]) -> dict[str, str]:
        async with get_client() as client:
            job = await DockerWorkerJobConfiguration.from_template_and_values(
                template, {}, client=client)
        return dict(job.env)

    with get_client(sync_client=True) as client:
        pools = [client.read_work_pool(name) for name in ("dgx", "ovx", "jetson")]
    for pool in pools:
        assert pool.type == "docker"
        assert _leaks(pool.base_job_template) == [], pool.name
        env = asyncio.run(rendered(pool.base_job_template))
        assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
        assert env["MLFLOW_TRACKING_PASSWORD"] == PASSWORD  # what the worker gives a container
        assert "PREFECT_API_AUTH_STRING" not in env
        assert "PREFECT_API_DATABASE_CONNECTION_URL" not in env


@pytest.mark.parametrize("spec", ["MLFLOW_TRACKING_PASSWORD", "X=Bad_Name", "1X=block",
                                  "X={{ evil }}"])
def test_a_malformed_secret_reference_is_refused(spec: str) -> None:
    pytest.importorskip("prefect_docker")
    from flows.docker_pools import docker_template

    with pytest.raises(ConfigError, match="--secret") as caught:
        docker_template("dgx", environ={"PHYSAI_HOME": "/srv/physai"}, secrets=[spec])
    assert caught.value.exit_code == 2


def test_a_credential_is_refused_before_a_pool_is_written() -> None:
    pytest.importorskip("prefect_docker")
    from flows.docker_pools import docker_template

    environ = {"PHYSAI_HOME": "/srv/physai", "PHYSAI_WORKER_ENV": "PREFECT_API_AUTH_STRING",
               "PREFECT_API_AUTH_STRING": "admin:auth-Str1ng"}
    with pytest.raises(ConfigError, match="PREFECT_API_AUTH_STRING: ") as caught:
        docker_template("dgx", environ=environ)
    assert _leaks(str(caught.value)) == []


# -- image builds: pip settings through a mounted file ----------------------------------------


@pytest.fixture
def pip_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The host's pip settings name an index whose URL holds a token; returns the token."""
    config = tmp_path / "host-pip.conf"
    config.write_text(f"[global]\nindex-url = https://__token__:{TOKEN}@pypi.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    return TOKEN


def test_pip_settings_reach_a_build_as_a_private_file(tmp_path: Path, pip_token: str) -> None:
    from flows.images import PIP_CONFIG, pip_settings, run_command

    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    mounts = pip_settings(work)
    conf = work / "pip.conf"
    assert f"index-url = https://__token__:{pip_token}@pypi.example/simple" in conf.read_text()
    assert conf.stat().st_mode & 0o077 == 0
    argv = run_command("c", "localhost/base:1", f"export PIP_CONFIG_FILE={PIP_CONFIG}; true",
                       [*mounts, "-v", f"{work}:/build:ro"])
    assert "-e" not in argv and not [a for a in argv if pip_token in a]
    # pip reads the file as written: what it lists from it is what the host's pip had.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], text=True,
                            env={**env, "PIP_CONFIG_FILE": str(conf)}, capture_output=True,
                            check=True).stdout
    assert f"index-url='https://__token__:{pip_token}@pypi.example/simple'" in listed


def test_a_failed_build_prints_no_url_credential() -> None:
    from flows.images import ImageBuildError, _check

    failing = [sys.executable, "-c", "import sys; print('Looking in indexes: https://__token__:"
               f"{TOKEN}@pypi.example/simple'); sys.exit(3)", f"https://u:{PASSWORD}@x/simple"]
    with pytest.raises(ImageBuildError) as caught:
        _check(failing, "building localhost/test")
    message = str(caught.value)
    assert "exit 3" in message and "https://<redacted>@pypi.example/simple" in message
    assert _leaks(message) == []


def _tiny_base(tmp_path: Path, podman: list[str]) -> str:
    """A two-program image (``sh``, ``cat`` and their libraries, from this machine), imported
    into podman: enough to run a build script in."""
    rootfs = tmp_path / "tiny.tar"
    programs = [shutil.which(p) for p in ("dash", "cat")]
    if None in programs:
        pytest.skip("dash or cat not found to make a tiny image of")
    libs = subprocess.run(["ldd", *map(str, programs)], capture_output=True, text=True).stdout
    with tarfile.open(rootfs, "w") as tar:
        tar.add(str(programs[0]), "bin/sh")
        tar.add(str(programs[1]), "bin/cat")
        for lib in {w for w in libs.split() if w.startswith("/") and not w.endswith(":")}:
            tar.add(os.path.realpath(lib), lib.lstrip("/"))
    name = "localhost/physai-test-tiny:1"
    subprocess.run([*podman, "import", str(rootfs), name], check=True, capture_output=True)
    return name


def test_a_committed_dependency_image_holds_no_pip_credential(
        tmp_path: Path, pip_token: str) -> None:
    from flows.images import ImageRecipe, build_deps, podman

    if shutil.which(podman()[0]) is None:
        pytest.skip("podman is not installed (make containers installs it)")
    base = _tiny_base(tmp_path, podman())
    name = "localhost/physai-test-deps:1"
    # The build sees the settings where pip looks for them, for this one container.
    recipe = ImageRecipe("test", "localhost/physai-test", (), 'cat "$PIP_CONFIG_FILE"',
                         editable=False)
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    try:
        build_deps(base, name, recipe, work)
        inspected = subprocess.run([*podman(), "image", "inspect", name], capture_output=True,
                                   text=True, check=True).stdout
        history = subprocess.run([*podman(), "history", "--no-trunc", name],
                                 capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run([*podman(), "rmi", "--force", name, base], capture_output=True)
    config = json.loads(inspected)[0]["Config"]
    assert not [e for e in config.get("Env", []) if e.startswith("PIP_")]
    assert pip_token not in inspected and pip_token not in history
