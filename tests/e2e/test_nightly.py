"""The nightly sim regression: an unchanged champion passes, a planted regression fails it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import run_flows

CliEnv = Callable[..., dict[str, str]]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fixtures" / "reach_tiny.yaml"
MODEL = "reach-tiny"

pytestmark = pytest.mark.e2e


def flows(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_flows(*args, env=env, cwd=cwd)


def _plant_degraded_champion(home: Path) -> str:
    """Register a version whose tags claim the champion's validation but whose policy has
    random weights, and point @champion at it as a careless manual promotion would."""
    import numpy as np

    from stages.core.settings import resolve_settings
    from stages.orchestration.context import open_services
    from stages.policies.local import build_policy, save_policy

    _, store, lineage = open_services(resolve_settings())
    champion = lineage.find_alias(MODEL, "champion")
    assert champion is not None
    good = store.get(champion.tags["physai.policy.digest"])
    rng = np.random.default_rng(1)
    module = build_policy(good.obs_dim, good.act_dim, good.hidden,
                          rng.normal(size=good.obs_dim).astype(np.float32),
                          np.ones(good.obs_dim, np.float32))
    path = home / "degraded.npz"
    save_policy(module, path, {"obs_dim": good.obs_dim, "act_dim": good.act_dim,
                               "hidden": list(good.hidden), "task": good.task})
    bad = store.publish(path, lambda digest, uri: good.model_copy(
        update={"digest": digest, "uri": uri}))
    tags = {**champion.tags, "physai.policy.digest": bad.digest}
    tags = {k: v for k, v in tags.items() if not k.startswith("physai.champion.")}
    version = lineage.client.create_model_version(MODEL, champion.source, tags=tags)
    lineage.set_alias(MODEL, "champion", str(version.version))
    return str(version.version)


def test_nightly_passes_unchanged_and_fails_planted_regression(
    tmp_path: Path, cli_env: CliEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / ".physai"
    env = cli_env(home)
    first = flows("run", str(CONFIG), env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]

    unchanged = flows("nightly", str(CONFIG), env=env, cwd=tmp_path)
    assert unchanged.returncode == 0, unchanged.stdout[-2000:] + unchanged.stderr[-2000:]
    assert "No regression" in unchanged.stdout and "REGRESSED" not in unchanged.stdout

    monkeypatch.setenv("PHYSAI_HOME", str(home))
    for var in ("MLFLOW_TRACKING_URI", "PHYSAI_STORE"):
        monkeypatch.delenv(var, raising=False)
    planted = _plant_degraded_champion(home)
    regressed = flows("nightly", str(CONFIG), env=env, cwd=tmp_path)
    assert regressed.returncode == 3, regressed.stdout[-2000:] + regressed.stderr[-2000:]
    assert f"models:/{MODEL}@champion (v{planted}) regressed" in regressed.stderr
    assert "REGRESSED: nominal" in regressed.stdout
    assert "nominal: challenger" in regressed.stderr

    from stages.core.settings import resolve_settings
    from stages.orchestration.context import open_services

    _, _, lineage = open_services(resolve_settings())
    assert lineage.find_alias(MODEL, "champion").version == planted  # never moved
    runs = lineage.client.search_runs(
        [lineage.client.get_experiment_by_name("reach-tiny-nightly").experiment_id],
        order_by=["attributes.start_time ASC"])
    assert [r.info.status for r in runs] == ["FINISHED", "FAILED"]
    assert [r.data.tags["physai.regressed"] for r in runs] == ["False", "True"]
    files = {f.path for f in lineage.client.list_artifacts(runs[1].info.run_id)}
    assert {"nightly_report.json", "nightly_report.md"} <= files
