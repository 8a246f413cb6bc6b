"""``flows worker`` passes SIGTERM and SIGINT on to the Prefect worker it starts, so stopping it
(systemd, Kubernetes, Ctrl-C) leaves no worker behind; against a real Prefect server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import alive, free_port, processes, run_flows

ROOT = Path(__file__).resolve().parents[2]
CliEnv = Callable[..., dict[str, str]]


@pytest.fixture(scope="module")
def prefect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    home = tmp_path_factory.mktemp("signals") / ".physai"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME")}
    env |= {"PHYSAI_HOME": str(home)}
    up = run_flows("server", "up", "--prefect-port", str(free_port()), "--mlflow-port",
                   str(free_port()), env=env, cwd=home.parent)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield env
    finally:
        run_flows("server", "down", env=env, cwd=home.parent)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_flows_worker_stops_its_prefect_worker(
    prefect: dict[str, str], sig: signal.Signals
) -> None:
    deploy = run_flows("deploy", "--project-dir", str(ROOT), "tests/fixtures/crash_micro.yaml",
                       env=prefect, cwd=ROOT)
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "worker", "dgx"], cwd=ROOT,
                            env=prefect, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (children := processes(parent=proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert children, "flows worker started no child"
        time.sleep(3)  # the Prefect worker is up and polling
        proc.send_signal(sig)  # to flows worker alone, as a supervisor stopping its main pid
        proc.wait(timeout=60)
        deadline = time.monotonic() + 40
        while any(alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [c for c in children if alive(c)], "the Prefect worker outlived flows worker"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
