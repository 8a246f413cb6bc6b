"""The five stages called directly on a tiny config, with MLflow embedded on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stages.config import load_pipeline
from stages.context import NullProgress
from stages.pipeline import run_direct, summary_markdown

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def tiny_config(tmp_path: Path, train: dict[str, object] | None = None,
                min_success: float = 0.5, **package: object) -> Path:
    data = yaml.safe_load((FIXTURES / "reach_tiny.yaml").read_text())
    data["collect"]["scene"] = str(ROOT / "sim_scenes" / "reach" / "collect.yaml")
    data["validate"]["suite"] = str(FIXTURES / "suite_tiny.yaml")
    data["collect"]["episodes"] = 40
    data["train"]["epochs"] = 5
    data["package"].update(package)
    data["train"].update(train or {})
    data["validate"]["min_success"] = min_success
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_failed_gate_registers_but_does_not_move_alias(
    physai_home: Path, tmp_path: Path
) -> None:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    result = run_direct(load_pipeline(tiny_config(tmp_path, max_latency_p99_ms=1e-6)),
                        NullProgress())
    assert not result.bundle.passed
    assert not result.promotion.promoted
    assert any(r.startswith("latency/p99_ms") for r in result.promotion.reasons)
    client = MlflowClient(f"sqlite:///{physai_home / 'mlflow.db'}")
    version = client.get_model_version("reach-tiny", result.promotion.version)
    assert version.tags["physai.gates_passed"] == "false"
    with pytest.raises(MlflowException):
        client.get_model_version_by_alias("reach-tiny", "champion")
    assert "not moved" in summary_markdown(result)


def test_artifacts_chain_parent_digests(physai_home: Path, tmp_path: Path) -> None:
    result = run_direct(load_pipeline(tiny_config(tmp_path)), NullProgress())
    assert result.policy.parents == (result.dataset.digest,)
    assert result.report.parents == (result.policy.digest,)
    assert result.bundle.parents == (result.policy.digest, result.report.digest)
    assert result.dataset.episodes == 40
    assert {s.scene for s in result.report.scenes} == {
        "nominal", "heavy_payload", "noisy_sensors"}
    for s in result.report.scenes:
        assert s.ci_low <= s.success_rate <= s.ci_high
    assert (physai_home / "store" / "artifacts").is_dir()


def test_challenger_worse_than_champion_is_not_promoted(
    physai_home: Path, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    good = run_direct(load_pipeline(tiny_config(tmp_path, min_success=0.0)), NullProgress())
    assert good.promotion.promoted and good.promotion.previous is None
    poor = run_direct(
        load_pipeline(tiny_config(tmp_path, {"epochs": 1, "lr": 1e-5}, min_success=0.0)),
        NullProgress(),
    )
    assert poor.report.passed and poor.bundle.passed, "only the comparison may stop it"
    assert not poor.promotion.promoted
    assert poor.promotion.previous == good.promotion.version
    assert poor.promotion.comparison.startswith("regressed")
    assert all(r.startswith(f"regression vs v{good.promotion.version}")
               for r in poor.promotion.reasons)
    client = MlflowClient(f"sqlite:///{physai_home / 'mlflow.db'}")
    champion = client.get_model_version_by_alias("reach-tiny", "champion")
    assert str(champion.version) == good.promotion.version
