"""Dispatch never drops a hardware request silently: a pool whose job template cannot take a
requested GPU, CPU or memory setting is refused, naming pool and variable."""

from __future__ import annotations

import pytest

from flows.deploy_plan import plan_pools
from flows.dispatch import fit_job_variables, with_run_env
from physai_core.errors import PhysaiError

PLANNED = {"nodes": 1, "nproc_per_node": 1, "gpus_per_node": 0, "env": {}}


def _declared(kubernetes: bool, computer: str = "dgx") -> dict[str, object]:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (pool,) = [p for p in plan_pools(kubernetes, root / "configs" / "k8s")
               if p.computer == computer]
    props: dict[str, object] = pool.base_job_template["variables"]["properties"]
    return props


@pytest.mark.parametrize(("name", "value"), [("gpus_per_node", 1), ("cpu", 8),
                                             ("memory", "64Gi")])
def test_a_process_pool_refuses_a_hardware_request(name: str, value: object) -> None:
    with pytest.raises(PhysaiError) as info:
        fit_job_variables({**PLANNED, name: value}, _declared(False), "train", "dgx")
    assert f"work pool 'dgx' cannot honour {name}={value!r}" in str(info.value)


def test_a_plain_stage_fits_a_process_pool() -> None:
    fitted = fit_job_variables(PLANNED, _declared(False), "train", "dgx")
    assert "gpus_per_node" not in fitted or fitted["gpus_per_node"] == 0
    assert "command" not in fitted


def test_a_kubernetes_pool_takes_the_gpu_request() -> None:
    declared = _declared(True)
    if "gpus_per_node" not in declared:
        pytest.fail(f"the dgx Kubernetes template declares no gpus_per_node: {sorted(declared)}")
    fitted = fit_job_variables({**PLANNED, "gpus_per_node": 2, "command": "torchrun"},
                               declared, "train", "dgx")
    assert fitted["gpus_per_node"] == 2 and "command" not in fitted


def test_a_pipeline_runs_env_reaches_its_stages_beneath_their_own() -> None:
    """What a caller sets on one pipeline run (a crash point, a thread count) reaches every
    stage's flow run; the stage's own resource settings win a clash."""
    planned = {**PLANNED, "env": {"OMP_NUM_THREADS": "4"}}
    run_env = {"PHYSAI_CRASH_AT": "train.epoch#2", "OMP_NUM_THREADS": "1"}
    fitted = fit_job_variables(with_run_env(planned, run_env), _declared(False), "train", "dgx")
    assert fitted["env"] == {"PHYSAI_CRASH_AT": "train.epoch#2", "OMP_NUM_THREADS": "4"}
    assert with_run_env(PLANNED, {}) == PLANNED
