"""The pipeline flow attaches its summary, the MLflow link and the sim-report table to the run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_flow_run_carries_summary_link_and_table(
    physai_home: Path, tiny_config: Callable[..., Path]
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.testing.utilities import prefect_test_harness

    from flows.pipeline import pipeline_flow

    path = tiny_config(validate={"video_episodes": 0})

    with prefect_test_harness(server_startup_timeout=120):
        state = pipeline_flow(config_path=str(path), return_state=True)
        assert state.is_completed()
        result = state.result()
        with get_client(sync_client=True) as client:
            artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    by_key = {a.key: a for a in artifacts}
    summary = by_key["reach-tiny-summary"]
    assert summary.type == "markdown"
    assert f"`models:/reach-tiny/{result.promotion.version}`" in str(summary.data)
    assert result.run_url in str(by_key["reach-tiny-mlflow-run"].data)
    table = by_key["reach-tiny-sim-report"]
    assert table.type == "table"
    for scene in ("nominal", "heavy_payload", "noisy_sensors"):
        assert scene in str(table.data)
