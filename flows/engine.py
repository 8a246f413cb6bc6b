"""The on-target engine build as a Prefect flow, for the ``jetson`` work pool.

A worker on the Jetson picks the flow run up, fetches the bundle from the artifact store by
digest (verifying it), builds and checks the TensorRT engine there, and records the report in
MLflow as an external model; the engine and its report stay in ``<PHYSAI_HOME>/engines``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from stages.context import open_services
from stages.engine_record import EXPERIMENT, build_from_bundle, record_engine


@flow(name="engine-build", flow_run_name="engine-{bundle_digest:.12}")
def engine_build_flow(
    bundle_digest: str,
    precision: str | None = None,
    builder: str = "python",
    any_gpu: bool = False,
    experiment: str = EXPERIMENT,
) -> dict[str, Any]:
    """Build the engine of the stored bundle ``bundle_digest`` on this machine; return the
    report. Fails, with the reason, on a machine without TensorRT."""
    settings, store, lineage = open_services()
    bundle = store.get(bundle_digest)
    path = store.open_payload(bundle)
    out = settings.home / "engines" / bundle.digest[:16]
    report = build_from_bundle(path, out, precision=precision, builder=builder, any_gpu=any_gpu)
    record_engine(report, lineage, experiment=experiment, bundle_digest=bundle.digest)
    return report
