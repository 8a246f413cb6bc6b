"""The nightly sim-regression flow: guards ``@champion`` and ends Failed when it regressed.

``flows deploy`` schedules it per pipeline config; Prefect's notifications fire on the Failed
state. The table and the markdown report are Prefect artifacts of the flow run (and an MLflow
run, see :mod:`stages.pipeline.nightly`). No alias is ever moved.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.stage_tasks import deployed_config
from stages.pipeline.config import load_pipeline
from stages.pipeline.nightly import RegressionDetected, nightly_markdown, nightly_rows, run_nightly


def _key(text: str) -> str:
    """A Prefect artifact key: lowercase letters, digits and dashes."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


@flow(name="nightly-regression", flow_run_name="nightly-{config_path}")
def nightly_regression(
    config_path: str = "configs/reach.yaml", alias: str = "champion", seed_offset: int = 0
) -> dict[str, Any]:
    """Run ``@alias`` of the config's model over its frozen suite against its baseline; a run
    of a deployment refuses a config outside its project folder."""
    pipeline = load_pipeline(deployed_config(config_path))
    report = run_nightly(pipeline, alias=alias, seed_offset=seed_offset)
    key = _key(f"nightly-{report.model}")
    create_table_artifact(nightly_rows(report), key=key,
                          description=f"models:/{report.model}@{alias} v{report.version} on "
                                      f"{report.suite}: baseline against tonight")
    create_markdown_artifact(nightly_markdown(report), key=f"{key}-report",
                             description="nightly sim regression report")
    if report.regressed:
        error = RegressionDetected(
            f"models:/{report.model}@{alias} (v{report.version}) regressed: "
            + "; ".join(report.comparison.reasons))
        error.markdown = nightly_markdown(report)
        raise error
    return report.model_dump(mode="json") | {"markdown": nightly_markdown(report)}
