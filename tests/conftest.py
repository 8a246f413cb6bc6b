"""Shared fixtures: an isolated state folder per test and the reach pipeline config."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

TinyConfig = Callable[..., Path]


STATE_VARS = ("PHYSAI_STORE", "MLFLOW_TRACKING_URI", "PREFECT_HOME", "PREFECT_API_URL",
              "PHYSAI_MLFLOW_ARTIFACTS", "PREFECT_LOCAL_STORAGE_PATH")
"""Variables that would point a run at state outside its ``PHYSAI_HOME`` (Prefect's result
storage holds the stage cache: a shared one would hand a test another test's results)."""


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Put ``os.environ`` back as it was after every test: an in-process ``flows`` command
    points the process at its state folder (``prepare_environment``), and that must not leak
    into the next test's runs."""
    saved = dict(os.environ)
    uris = _mlflow_uris()
    yield
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    os.environ.update(saved)
    _set_mlflow_uris(uris)


def _mlflow_uris() -> tuple[str | None, str | None] | None:
    """MLflow's process-wide tracking and registry URIs (``mlflow.set_tracking_uri``, which an
    in-process run sets); None before MLflow is imported."""
    if "mlflow" not in sys.modules:
        return None
    from mlflow.tracking._model_registry import utils as registry
    from mlflow.tracking._tracking_service import utils as tracking

    return tracking._tracking_uri, registry._registry_uri


def _set_mlflow_uris(uris: tuple[str | None, str | None] | None) -> None:
    """Put MLflow's process-wide URIs back: a server an earlier test stopped must not be the
    registry a later test's ``MlflowClient`` asks."""
    if "mlflow" not in sys.modules:
        return
    from mlflow.tracking._model_registry import utils as registry
    from mlflow.tracking._tracking_service import utils as tracking

    tracking._tracking_uri, registry._registry_uri = uris if uris is not None else (None, None)


@pytest.fixture
def physai_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``PHYSAI_HOME`` with every location under it."""
    home = tmp_path / "physai"
    monkeypatch.setenv("PHYSAI_HOME", str(home))
    for var in STATE_VARS:
        monkeypatch.delenv(var, raising=False)
    return home


CliEnv = Callable[..., dict[str, str]]


@pytest.fixture(scope="session")
def shared_prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Prefect server for the session's ``flows`` subprocesses; yields its API URL.

    A ``flows run`` without ``PREFECT_API_URL`` starts a temporary server of its own, which
    costs seconds a run; the runs' results, store and MLflow state stay under each test's own
    ``PHYSAI_HOME`` either way, only the flow-run records share this server.
    """
    from tests.support import PrefectServer

    server = PrefectServer(tmp_path_factory.mktemp("prefect-server"))
    server.start()
    yield server.api
    server.stop()


@pytest.fixture(scope="module")
def prefect_api() -> Iterator[str]:
    """A real Prefect server for this module's tests; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield str(PREFECT_API_URL.value())


@pytest.fixture
def cli_env(request: pytest.FixtureRequest) -> CliEnv:
    """Environment for a ``flows`` subprocess whose state all lives under ``home``:
    ``cli_env(home, **extra)`` (wide lines, so output can be searched whole).

    Its runs report to the session's shared Prefect server (:func:`shared_prefect_api`);
    ``cli_env(home, shared_prefect=False)`` leaves ``PREFECT_API_URL`` unset instead, for a test
    of the temporary server, of servers that ``flows server up`` starts, or of what is written
    under the home's own Prefect folder.
    """

    def make(home: Path, *, shared_prefect: bool = True, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in STATE_VARS}
        if shared_prefect:
            env["PREFECT_API_URL"] = request.getfixturevalue("shared_prefect_api")
        return {**env, "PHYSAI_HOME": str(home), "COLUMNS": "200", **extra}

    return make


LONGEST_FIRST = ("tests/e2e/test_crash.py", "tests/e2e/test_crash_late.py",
                 "tests/e2e/test_isaaclab_task.py", "tests/e2e/test_pipeline_e2e.py",
                 "tests/e2e/test_isaaclab_venv.py",
                 "tests/e2e/test_stage_environment.py",
                 "tests/e2e/test_ray_cluster.py", "tests/e2e/test_docker_pools.py",
                 "tests/e2e/test_lerobot_venv.py", "tests/e2e/test_lerobot_train_e2e.py",
                 "tests/e2e/test_lerobot_act_e2e.py", "tests/e2e/test_lerobot_diffusion_e2e.py",
                 "tests/e2e/test_isaaclab_locomotion.py", "tests/e2e/test_benchmarks_e2e.py",
                 "tests/e2e/test_benchmark_pipeline_e2e.py")
"""Files that take longest, run first: on several workers (``make test``) a long file that
starts last is the run's tail."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put :data:`LONGEST_FIRST` ahead; every other test keeps its collected order."""
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)


def pytest_configure(config: pytest.Config) -> None:
    """Offscreen rendering through EGL, chosen before anything imports MuJoCo; OpenMP's idle
    threads sleep instead of spinning, chosen before anything imports torch.

    ``make test`` runs more workers than cores, each with torch's OpenMP threads: spinning
    threads take the cores other workers' simulations and servers wait for (three copies of
    one end-to-end file ran 7% faster and used 7% less CPU with them asleep). How long they
    wait changes no result."""
    import os

    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """With ``PHYSAI_TEST_TIMELINE=FILE``, append one JSON line per test to FILE: its worker,
    start and end (epoch seconds, setup to teardown), and the CPU seconds its worker and the
    worker's waited-for children spent meanwhile (servers a test leaves running, Ray's nodes
    and podman's containers are not children). ``scripts/test_timeline.py FILE`` sums them by
    file: which tests hold ``make test``'s cores, and when."""
    out = os.environ.get("PHYSAI_TEST_TIMELINE")
    if not out:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> tuple[float, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime

    start, (own, kids) = time.time(), cpu()
    yield
    end, (own_after, kids_after) = time.time(), cpu()
    line = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "start": start, "end": end, "cpu_self": own_after - own,
            "cpu_children": kids_after - kids}
    with open(out, "a") as handle:
        handle.write(json.dumps(line) + "\n")


@pytest.fixture
def tiny_config(tmp_path: Path) -> TinyConfig:
    """Write a very small reach pipeline config (40 episodes, 5 epochs, 3 scenes) with the given
    per-section overrides; returns its path."""

    def write(name: str = "pipeline.yaml", **sections: dict[str, object]) -> Path:
        from tests.support import reach_tiny_config

        ours: dict[str, dict[str, object]] = {"collect": {"episodes": 40}, "train": {"epochs": 5}}
        for section, values in sections.items():
            ours[section] = {**ours.get(section, {}), **values}
        return reach_tiny_config(tmp_path / name, **ours)

    return write


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` on SQLite for the module; yields its URL."""
    from tests.support import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    server.start()
    yield server.url
    server.stop(signal.SIGTERM)
