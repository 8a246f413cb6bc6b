"""The on-target engine build as a Prefect flow, for the ``jetson`` work pool.

A worker on the Jetson picks the flow run up, fetches the bundle from the artifact store by
digest, reads it once and checks it whole (its signature by ``trust_key``, by default the
project's own public key), builds and checks the TensorRT engine there, and records the
report in MLflow as an external model; the engine and its report stay in
``<PHYSAI_HOME>/engines``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from physai_core.errors import IntegrityError
from stages.orchestration.context import open_services
from stages.steps.bundles import default_trust_key
from stages.tracking.engine_record import EXPERIMENT, build_from_bundle, record_engine


@flow(name="engine-build", flow_run_name="engine-{bundle_digest:.12}")
def engine_build_flow(
    bundle_digest: str,
    precision: str | None = None,
    builder: str = "python",
    any_gpu: bool = False,
    experiment: str = EXPERIMENT,
    trust_key: str | None = None,
    allow_unsigned: bool = False,
) -> dict[str, Any]:
    """Build the engine of the stored bundle ``bundle_digest`` on this machine; return the
    report. ``trust_key`` is the PEM public key of the bundle's signer on this machine
    (default: the project's own); an unsigned bundle runs only with ``allow_unsigned``. Fails,
    with the reason, on a machine without TensorRT."""
    settings, store, lineage = open_services()
    bundle = store.get(bundle_digest)
    path = store.open_payload(bundle)
    out = settings.home / "engines" / bundle.digest[:16]
    trust = Path(trust_key) if trust_key else default_trust_key(settings)
    report, digest = build_from_bundle(path, out, precision=precision, builder=builder,
                                       any_gpu=any_gpu, trust_key=trust,
                                       allow_unsigned=allow_unsigned)
    if digest != bundle.digest:
        raise IntegrityError(f"{path}: sha256 {digest} is not the stored bundle {bundle.digest}")
    record_engine(report, lineage, experiment=experiment, bundle_digest=bundle.digest)
    return report
