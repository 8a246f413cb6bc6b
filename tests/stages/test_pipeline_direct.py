"""The five stages called directly on a tiny config, with MLflow embedded on SQLite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stages.orchestration.context import NullProgress
from stages.pipeline.config import load_pipeline
from stages.pipeline.run import run_direct, summary_markdown

TinyConfig = Callable[..., Path]


def test_failed_gate_registers_but_does_not_move_alias(
    physai_home: Path, tiny_config: TinyConfig
) -> None:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    result = run_direct(load_pipeline(tiny_config(package={"max_latency_p99_ms": 1e-6})),
                        NullProgress())
    assert not result.bundle.passed
    assert not result.promotion.promoted
    assert any(r.startswith("latency/p99_ms") for r in result.promotion.reasons)
    uri = f"sqlite:///{physai_home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    version = client.get_model_version("reach-tiny", result.promotion.version)
    assert version.tags["physai.gates_passed"] == "false"
    with pytest.raises(MlflowException):
        client.get_model_version_by_alias("reach-tiny", "champion")
    assert "not moved" in summary_markdown(result)


def test_artifacts_chain_parent_digests(physai_home: Path, tiny_config: TinyConfig) -> None:
    result = run_direct(load_pipeline(tiny_config()), NullProgress())
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
    physai_home: Path, tiny_config: TinyConfig
) -> None:
    from mlflow import MlflowClient

    gates_off = {"min_success": 0.0}
    good = run_direct(load_pipeline(tiny_config(validate=gates_off)), NullProgress())
    assert good.promotion.promoted and good.promotion.previous is None
    poor = run_direct(
        load_pipeline(tiny_config(train={"epochs": 1, "lr": 1e-5}, validate=gates_off)),
        NullProgress(),
    )
    assert poor.report.passed and poor.bundle.passed, "only the comparison may stop it"
    assert not poor.promotion.promoted
    assert poor.promotion.previous == good.promotion.version
    assert poor.promotion.comparison.startswith("regressed")
    assert all(r.startswith(f"regression vs v{good.promotion.version}")
               for r in poor.promotion.reasons)
    uri = f"sqlite:///{physai_home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    champion = client.get_model_version_by_alias("reach-tiny", "champion")
    assert str(champion.version) == good.promotion.version


def test_an_on_target_engine_report_must_pass_before_the_alias_moves(
    physai_home: Path, tiny_config: TinyConfig, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from edge import engine
    from edge.bundle import unpack_bundle
    from edge.engine import EngineCheck
    from flows.cli import main
    from stages.orchestration.context import open_services
    from stages.tracking.engine_record import record_engine

    result = run_direct(load_pipeline(tiny_config(promote={"require_engine_report": True})),
                        NullProgress())
    assert result.bundle.passed and not result.promotion.promoted
    (reason,) = result.promotion.reasons
    assert reason.startswith("no on-target engine report of bundle")
    latency = next(g for g in result.bundle.gates if g.name == "latency/p99_ms")
    assert "measured on the packaging host" in latency.detail
    version = result.promotion.version
    promote = ["promote", "reach-tiny", "--version", version, "--why", "engine checked"]
    assert main(promote) == 2
    assert "no on-target engine report" in capsys.readouterr().err

    _, store, lineage = open_services()
    unpack_bundle(store.open_payload(result.bundle), tmp_path / "bundle")
    plan = engine.plan_build(tmp_path / "bundle", precision="fp16")

    def report(p99_us: float) -> None:
        check = EngineCheck(samples=256, max_abs_diff=1e-3, tolerance=plan.tolerance,
                            passed=True, latency_p50_us=p99_us / 2, latency_p99_us=p99_us,
                            latency_iters=100)
        record_engine(engine.engine_report(
            plan, check, engine_sha256="cd" * 32, engine_bytes=1000, tensorrt="10.13",
            gpu="Thor", compute_capability="sm_110", build_seconds=1.0, command=["trtexec"]),
            lineage, bundle_digest=result.bundle.digest)

    report(p99_us=1e6)  # a second per step: over any budget
    assert main(promote) == 2
    assert "engine report of bundle" in (err := capsys.readouterr().err) and "failed: p99" in err
    report(p99_us=200.0)
    assert main(promote) == 0
    assert lineage.find_alias("reach-tiny", "champion").version == version  # type: ignore[union-attr]
