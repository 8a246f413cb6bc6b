"""A Ray cluster of three nodes started with ``ray start`` on this machine, as a cluster's nodes
are: not by the driver, in another folder, without its environment. The head stands for a dgx,
the two workers for ovx computers (custom resources). Collect and train run on the dgx node,
validation scenes and the validate and promote stages on the ovx nodes, package (no jetson
node) in the driver; all publish into the driver's store. One ovx node's raylet is killed
while it runs a scene, and the run still finishes with the digests of the same pipeline run
in-process on one thread, as a one-CPU node trains. With no ovx node left, the stage fails in
one line naming the pool. Ray's state API, served by the head's dashboard, lists each task on
the node the MLflow run records."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import free_port, run_flows

pytest.importorskip("prefect_ray")
CliEnv = Callable[..., dict[str, str]]
pytestmark = pytest.mark.e2e

RAY = str(Path(sys.executable).parent / "ray")
NODES = ({"dgx": 1}, {"ovx": 1}, {"ovx": 1})
"""Resources of the head and the two workers."""


class RayCluster:
    """Ray nodes started with ``ray start`` under their own temporary folder and ports, each
    with one CPU; only this cluster's processes are ever stopped (never ``ray stop``)."""

    def __init__(self, folder: Path) -> None:
        # Ray's socket paths must stay short: its own folder under /tmp, not pytest's.
        self.temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
        self.folder = folder
        self.port = free_port()
        self.dashboard = f"http://127.0.0.1:{free_port()}"
        """The head's dashboard, which serves Ray's state API."""
        self.raylets: list[int] = []
        self.env = {"PATH": os.environ["PATH"], "HOME": str(folder), "RAY_AUTH_MODE": "disabled",
                    "RAY_USAGE_STATS_ENABLED": "0"}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the head, then the workers, one after another."""
        import json

        for i, resources in enumerate(NODES):
            where = (["--head", f"--port={self.port}", "--include-dashboard=true",
                      "--dashboard-host=127.0.0.1", f"--temp-dir={self.temp}",
                      f"--dashboard-port={self.dashboard.rsplit(':', 1)[1]}",
                      f"--ray-client-server-port={free_port()}",
                      # a killed node is declared dead after ~3 s, not Ray's ~15 s
                      '--system-config={"health_check_period_ms": 1000, '
                      '"health_check_failure_threshold": 3}']
                     if i == 0 else [f"--address={self.address}"])
            before = set(self._raylets())
            proc = subprocess.run(
                [RAY, "start", *where, "--num-cpus=1", f"--resources={json.dumps(resources)}",
                 "--object-store-memory=80000000", "--dashboard-agent-listen-port=0",
                 "--disable-usage-stats"],
                cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=180)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            (new,) = set(self._raylets()) - before
            self.raylets.append(new)

    def _processes(self) -> dict[int, tuple[int, str]]:
        """Every process: its parent and command line."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            found[int(entry.name)] = (ppid, cmd)
        return found

    def _raylets(self) -> list[int]:
        return [pid for pid, (_, cmd) in self._processes().items()
                if "raylet/raylet" in cmd and str(self.temp) in cmd]

    def node_running(self, task: str) -> int | None:
        """The raylet of a worker node on which a task named ``task`` is executing now."""
        procs = self._processes()
        for ppid, cmd in procs.values():
            if cmd.startswith(f"ray::{task}") and ppid in self.raylets[1:]:
                return ppid
        return None

    def stop(self) -> None:
        """SIGKILL this cluster's processes (those naming its folder or its head's address,
        and their children) and remove its temporary folder."""
        procs = self._processes()
        own = {pid for pid, (_, cmd) in procs.items()
               if str(self.temp) in cmd or f"--address={self.address}" in cmd
               or f":{self.port} " in cmd}
        own |= {pid for pid, (ppid, _) in procs.items() if ppid in own}
        for pid in own:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture
def ray_cluster(tmp_path: Path) -> Iterator[RayCluster]:
    folder = tmp_path / "nodes"
    folder.mkdir()
    cluster = RayCluster(folder)
    try:
        t0 = time.perf_counter()
        cluster.start()
        print(f"ray cluster of {len(NODES)} nodes up in {time.perf_counter() - t0:.1f} s")
        yield cluster
    finally:
        cluster.stop()


def digests(home: Path) -> dict[str, object]:
    """What version 1 of the registered model was made of
    (:func:`tests.support.version_made_of`)."""
    from tests.support import version_made_of

    return version_made_of(f"sqlite:///{home / 'mlflow.db'}", "reach-tiny")


def placements(home: Path) -> dict[str, str]:
    """The pipeline run's ``physai.ray.*`` tags: where each Ray task ran."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    run_id = client.get_model_version("reach-tiny", "1").tags["physai.pipeline_run_id"]
    return {k: v for k, v in client.get_run(run_id).data.tags.items()
            if k.startswith("physai.ray.")}


def ran_where_ray_says(where: dict[str, str], dashboard: str) -> bool:
    """Whether Ray's state API lists each recorded task as finished on the recorded node."""
    from ray.util.state import list_tasks

    for value in where.values():
        fields = dict(f.split("=", 1) for f in value.split())
        runs = list_tasks(address=dashboard, filters=[("task_id", "=", fields["task"])],
                          detail=True, raise_on_missing_output=False)
        finished = [t.node_id for t in runs if t.state == "FINISHED"]
        assert finished == [fields["node"]], (value, runs)
    return True


def test_node_loss_during_validation(
    tmp_path: Path, tiny_config: Callable[..., Path], cli_env: CliEnv,
    ray_cluster: RayCluster,
) -> None:
    config = tiny_config()
    here = tmp_path / "here"
    t0 = time.perf_counter()
    # Ray runs a one-CPU task on one thread; torch's sums, and so the policy's bytes, depend
    # on how many threads train.
    proc = run_flows("run", str(config), env=cli_env(here, OMP_NUM_THREADS="1"), cwd=tmp_path,
                     timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    in_process = time.perf_counter() - t0

    home = tmp_path / "driver"
    env = cli_env(home, shared_prefect=False, RAY_AUTH_MODE="disabled")
    t0 = time.perf_counter()
    run = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", str(config), "--task-runner", "ray",
         "--ray-address", ray_cluster.address],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim = None
    while victim is None and run.poll() is None:
        victim = ray_cluster.node_running("validate-scene")
        time.sleep(0.05)
    assert victim is not None, "no scene ran on a worker node"
    os.kill(victim, signal.SIGKILL)
    out, _ = run.communicate(timeout=600)
    on_ray = time.perf_counter() - t0
    (tmp_path / "ray-run.log").write_text(out)
    print(f"in-process {in_process:.1f} s, on the Ray cluster with a node killed {on_ray:.1f} s")
    assert run.returncode == 0, out[-4000:]
    assert "the task will be retried" in out, "Ray did not run the lost scene again"

    assert digests(home) == digests(here)
    where = placements(home)
    scenes = {f"physai.ray.validate-scene.{s}"
              for s in ("nominal", "heavy_payload", "noisy_sensors")}
    stages = {f"physai.ray.{s}": c for s, c in
              (("collect", "dgx"), ("train", "dgx"), ("validate", "ovx"), ("promote", "ovx"))}
    assert set(where) == scenes | set(stages), where  # package: no node offers jetson
    for key, value in where.items():
        assert f"resources={stages.get(key, 'ovx')} " in value, (key, value)
    assert ran_where_ray_says(where, ray_cluster.dashboard)

    # The other ovx node goes too: the stage fails in one line, naming the pool.
    (other,) = set(ray_cluster.raylets[1:]) - {victim}
    os.kill(other, signal.SIGKILL)
    failed = run_flows("run", str(config), "--task-runner", "ray", "--ray-address",
                       ray_cluster.address, env=env, cwd=tmp_path, timeout=300)
    assert failed.returncode != 0
    line = re.search(r"^flows: error: .*$", failed.stdout + failed.stderr, re.MULTILINE)
    assert line is not None, (failed.stdout + failed.stderr)[-4000:]
    assert "validate: no live Ray node offers the resource 'ovx' (the ovx pool)" in line[0]
