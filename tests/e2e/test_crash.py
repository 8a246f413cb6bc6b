"""Crash consistency: SIGKILL the pipeline at every crash point a run passes, then re-run.

A first run of the smallest full pipeline records every crash point it passes
(:mod:`stages.core.crash`), in order: stage boundaries, collection batches, training epochs,
validated scenes, artifact payloads written before their manifests, temporary files written
before their rename, MLflow runs, model registration and the registry lock. Then, in one
state folder, the pipeline is run again and again, each run SIGKILLed at the next point of
that list (the first half of the list here, the second in tests/e2e/test_crash_late.py, so
that two test workers share the work). After every kill the store must hold no artifact whose
bytes do not verify, and the next run must reuse every stage the killed run completed. A point
a resumed run never reaches (its stage was cached) is tried again from an empty state folder. A
last run completes and its artifacts have the digests of the first, uninterrupted run.

Each run is a fork of one process that has the pipeline's modules already imported
(tests/e2e/crash_forkserver.py), talking to one Prefect server, so a run costs seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import PrefectServer, keypair

ROOT = Path(__file__).resolve().parents[2]
MIN_POINTS = 50
STAGES = ("collect", "train", "validate-scene", "validate", "package", "promote")

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Prefect server for every run of the harness."""
    server = PrefectServer(tmp_path_factory.mktemp("prefect-server"))
    server.start()
    yield server.api
    server.stop()


class ForkServer:
    """The harness's runs: each a fork of one process that has the pipeline's modules imported
    (tests/e2e/crash_forkserver.py)."""

    def __init__(self, api: str, log: Path, signing_key: Path) -> None:
        self.api = api
        self._log = log.open("w")
        # Every run signs with one configured key, as a team's packaging workers do: each
        # empty state folder would otherwise make a project key of its own.
        self._proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "e2e" / "crash_forkserver.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PHYSAI_SIGNING_KEY": str(signing_key)},
            cwd=ROOT)

    def run(self, home: Path, log: Path, crash_at: str | None, trace: Path) -> int:
        """Run the pipeline with its state in ``home``; its exit status (negative: killed by
        that signal)."""
        stdin, stdout = self._proc.stdin, self._proc.stdout
        if stdin is None or stdout is None:
            raise RuntimeError("the fork server has no pipes")
        stdin.write(json.dumps({"home": str(home), "api": self.api, "log": str(log),
                                "crash_at": crash_at, "trace": str(trace)}) + "\n")
        stdin.flush()
        answer = stdout.readline()
        if not answer:
            raise RuntimeError(f"the fork server died: see {self._log.name}")
        return int(answer)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=60)
        self._log.close()


def _points(trace: Path) -> list[str]:
    return trace.read_text().split() if trace.is_file() else []


def _stage_marks(points: list[str], mark: str) -> set[str]:
    """Stages (scenes as ``validate-scene.<i>``) a run's trace marks ``completed`` or
    ``cached``: ``stage.train.cached#1`` -> ``train``."""
    found = set()
    for point in points:
        name = point.split("#")[0].split(".")
        if name[0] == "stage" and len(name) >= 3 and name[2] == mark:
            found.add(".".join([name[1], *name[3:]]))
    return found


def _store_problems(home: Path) -> list[str]:
    """Every visible artifact whose payload is missing or does not match its digest."""
    from physai_core.errors import PhysaiError
    from stages.storage.store import LocalStore

    root = home / "store"
    store = LocalStore(root)
    problems = []
    for manifest in sorted((root / "artifacts").glob("*.json")) if root.exists() else []:
        try:
            store.open_payload(store.get(manifest.stem))
        except (PhysaiError, OSError) as exc:
            problems.append(f"{manifest.name}: {exc}")
    return problems


def _digests(home: Path) -> dict[str, str]:
    """Artifact kind -> digest for the single-instance kinds of a finished run's store."""
    kinds: dict[str, set[str]] = {}
    for manifest in (home / "store" / "artifacts").glob("*.json"):
        data = json.loads(manifest.read_text())
        kinds.setdefault(data["kind"], set()).add(manifest.stem)
    return {k: v.pop() for k, v in kinds.items()
            if k in ("dataset", "policy", "sim_report", "edge_bundle") and len(v) == 1}


@dataclass
class Harness:
    """What the crash runs did."""

    points: list[str]
    """Every crash point of the uninterrupted run, in order."""
    part: list[str]
    """The points this harness kills at: its share of ``points``."""
    home: Path
    """The state folder of the killed runs."""
    killed: list[str] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    baseline: dict[str, str] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)
    final_trace: list[str] = field(default_factory=list)
    final_code: int = -1
    seconds: float = 0.0


PARTS = 2
"""The kill points are shared out among this many harnesses, each a test file of its own, so
that test workers run them side by side (the second half: tests/e2e/test_crash_late.py)."""


def crash_harness(prefect_api: str, tmp_path_factory: pytest.TempPathFactory,
                  part: int) -> Iterator[Harness]:
    """Kill the pipeline at every point of share ``part`` (of :data:`PARTS`) of the crash
    points, one run after another in one state folder, then finish it."""
    start = time.monotonic()
    work = tmp_path_factory.mktemp(f"crash-{part}")
    server = ForkServer(prefect_api, work / "forkserver.log", keypair(work, "signing")[0])
    try:
        yield _crash_runs(server, work, start, part)
    finally:
        server.close()


@pytest.fixture(scope="module")
def harness(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    yield from crash_harness(prefect_api, tmp_path_factory, part=0)


def _crash_runs(server: ForkServer, work: Path, start: float, part: int) -> Harness:
    _run = server.run
    first = work / "baseline" / ".physai"
    first.parent.mkdir()
    code = _run(first, work / "baseline.log", None, work / "baseline.trace")
    assert code == 0, (work / "baseline.log").read_text()[-3000:]
    points = _points(work / "baseline.trace")
    share = points[part * len(points) // PARTS:(part + 1) * len(points) // PARTS]
    home = work / "chain" / ".physai"
    result = Harness(points=points, part=share, home=home, baseline=_digests(first))
    home.parent.mkdir()
    completed_before: set[str] = set()
    for i, point in enumerate(share):
        trace = work / f"run-{i}.trace"
        code = _run(home, work / f"run-{i}.log", point, trace)
        if code == 0:  # a cached stage skipped this point: try it from an empty state
            result.restarts.append(point)
            shutil.rmtree(home)
            completed_before = set()
            trace.unlink(missing_ok=True)
            code = _run(home, work / f"run-{i}.log", point, trace)
        seen = _points(trace)
        if code != -signal.SIGKILL or not seen or seen[-1] != point:
            result.failures.append(f"{point}: exit {code}, last point "
                                   f"{seen[-1] if seen else None}: "
                                   f"{(work / f'run-{i}.log').read_text()[-600:]}")
            break
        result.killed.append(point)
        cached = _stage_marks(seen, "cached")
        lost = sorted(completed_before - cached)
        if lost:
            result.failures.append(f"{point}: stages {lost} completed before were not reused")
        problems = _store_problems(home)
        if problems:
            result.failures.append(f"{point}: store holds unverifiable artifacts {problems}")
        completed_before |= _stage_marks(seen, "completed")
    result.final_code = _run(home, work / "final.log", None, work / "final.trace")
    result.final_trace = _points(work / "final.trace")
    result.final = _digests(home)
    result.seconds = time.monotonic() - start
    (work / "summary.json").write_text(json.dumps({
        "points": len(result.points), "part": part, "killed": len(result.killed),
        "restarts": result.restarts, "seconds": round(result.seconds, 1)}, indent=2))
    print(f"\ncrash harness: {len(result.killed)} kill points, {len(result.restarts)} from an "
          f"empty state, {result.seconds:.0f} s")
    return result


def test_run_passes_enough_crash_points_in_every_stage(harness: Harness) -> None:
    assert len(harness.points) >= MIN_POINTS, harness.points
    for needle in ("collect.batch", "train.epoch", "validate.scene_evaluated",
                   "store.publish.payload_written.policy", "store.write.temp_written",
                   "register.version_created", "alias.lock_held", "package.bundle_written"):
        assert any(p.startswith(needle) for p in harness.points), needle


def test_every_kill_is_survived(harness: Harness) -> None:
    assert harness.failures == []
    assert harness.killed == harness.part and len(harness.part) >= len(harness.points) // PARTS
    assert harness.final_code == 0


def test_the_finished_run_has_the_uninterrupted_digests(harness: Harness) -> None:
    assert set(harness.baseline) == {"dataset", "policy", "sim_report", "edge_bundle"}
    assert harness.final == harness.baseline


def test_one_champion_and_no_duplicate_version_after_the_crashes(harness: Harness) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{harness.home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    versions = client.search_model_versions("name = 'reach-crash'")
    bundles = [v.tags.get("physai.bundle.digest") for v in versions]
    assert len(bundles) == len(set(bundles)) == 1, bundles
    assert str(client.get_model_version_by_alias("reach-crash", "champion").version) == "1"
    locks = [m.name for m in client.search_registered_models() if m.name.startswith("physai-")]
    assert locks == []
