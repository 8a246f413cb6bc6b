"""The package stage: ONNX export with the normalizer inside, parity, latency, edge bundle."""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict
from typing import TYPE_CHECKING

import numpy as np

from stages.artifacts import Dataset, EdgeBundle, GateResult, Policy, SimReport
from stages.config import PackageConfig
from stages.context import StageContext
from stages.crash import crash_point
from stages.data import read_transitions
from stages.errors import IntegrityError
from stages.hashing import sha256_file
from stages.policy import load_policy
from stages.sim.tasks import get_task

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

STAGE_VERSION = "2"
PARITY_SAMPLES = 4096
OOD_SAMPLES = 1024
PARITY_WORLDS = 32
OOD_TOLERANCE_FACTOR = 10.0


def training_dataset(policy: Policy, ctx: StageContext) -> Dataset | None:
    """The dataset ``policy`` was cloned from; None for a policy trained in simulation."""
    if not policy.parents:
        return None
    dataset = ctx.store.get(policy.parents[0])
    if not isinstance(dataset, Dataset):
        raise IntegrityError(f"policy parent {dataset.digest} is a {dataset.kind}, not a dataset")
    return dataset


def rollout_observations(module: torch.nn.Module, ctx: StageContext) -> np.ndarray:
    """Observations met by ``module`` driving the first scene of the suite (one episode of
    PARITY_WORLDS worlds): real simulator inputs for a policy that has no dataset."""
    from stages.policy import policy_fn

    scene, _, seed = ctx.pipeline.suite.scenes[0]
    spec = get_task(ctx.pipeline.config.task)
    env = spec.make_env(scene, PARITY_WORLDS, seed)
    act = policy_fn(module)
    obs = env.reset()
    seen = [obs]
    for _ in range(env.episode_steps - 1):
        obs, _, _ = env.step(act(obs))
        seen.append(obs)
    env.close()
    return np.concatenate(seen)


def package(cfg: PackageConfig, policy: Policy, report: SimReport, ctx: StageContext) -> EdgeBundle:
    """Export ``policy`` for ``cfg.target``, check it against PyTorch and pack the bundle.

    The bundle holds only content (model, I/O spec, normalization, target, parity, digests), so
    the same policy packs to the same bytes; measured latency and run ids live on the
    :class:`EdgeBundle` record and in MLflow.
    """
    from edge.bench import onnx_latency
    from edge.engine import draw_calibration_set
    from edge.export import export_onnx
    from edge.pack import pack_policy_bundle
    from edge.targets import get_target, preflight
    from edge.verify import check_parity, ood_probes

    target = get_target(cfg.target)
    preflight(target, cfg.opset, cfg.precision)
    spec = get_task(policy.task)
    module, _ = load_policy(ctx.store.open_payload(policy))
    dataset = training_dataset(policy, ctx)
    if dataset is not None:
        obs = read_transitions(ctx.store.open_payload(dataset), spec.obs_dim, spec.act_dim).obs
        source = "dataset observations"
    else:
        obs = rollout_observations(module, ctx)
        source = "observations of the policy's own rollouts in the first suite scene"
    rng = np.random.default_rng(ctx.seed)
    sample = obs[rng.choice(len(obs), min(PARITY_SAMPLES, len(obs)), replace=False)]

    work = ctx.scratch / f"package-{policy.digest[:16]}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with ctx.lineage.stage_run(ctx.experiment, "package", ctx.pipeline_run_id, {}) as run:
        run.log_params({**cfg.model_dump(), "device": target.device})
        onnx_path = export_onnx(module, spec.obs_dim, work / "policy.onnx", opset=cfg.opset)
        crash_point("package.exported")
        parity = check_parity(module, onnx_path, sample, tolerance=cfg.parity_tolerance)
        ood = check_parity(module, onnx_path, ood_probes(sample, OOD_SAMPLES, ctx.seed),
                           tolerance=cfg.parity_tolerance * OOD_TOLERANCE_FACTOR)
        latency = onnx_latency(onnx_path, spec.obs_dim, iters=cfg.latency_iters)
        budget_ms = 1000.0 / cfg.control_hz
        gates = (
            GateResult(name="parity/dataset", measured=parity.max_abs_diff,
                       threshold=cfg.parity_tolerance, passed=parity.passed,
                       detail=f"{parity.samples} {source}"),
            GateResult(name="parity/ood", measured=ood.max_abs_diff, threshold=ood.tolerance,
                       passed=ood.passed, detail=f"{ood.samples} out-of-distribution probes"),
            GateResult(name="latency/p99_ms", measured=latency.p99_us / 1000,
                       threshold=min(cfg.max_latency_p99_ms, budget_ms),
                       passed=latency.p99_us / 1000 <= min(cfg.max_latency_p99_ms, budget_ms),
                       detail=f"ONNX Runtime CPU batch 1, {latency.iters} runs"),
        )
        passed = all(g.passed for g in gates)
        onnx_digest = sha256_file(onnx_path)
        manifest = {
            "task": spec.name,
            "io": {
                "obs": {"name": "obs", "shape": ["batch", spec.obs_dim], "dtype": "float32",
                        "names": list(spec.obs_names), "units": list(spec.obs_units)},
                "actions": {"name": "actions", "shape": ["batch", spec.act_dim],
                            "dtype": "float32", "names": list(spec.action_names),
                            "units": list(spec.action_units), "range": [-1.0, 1.0]},
            },
            "normalization": {
                "baked_into_model": True,
                "obs_mean": module.state_dict()["obs_mean"].tolist(),
                "obs_std": module.state_dict()["obs_std"].tolist(),
            },
            "control_hz": cfg.control_hz,
            "latency_budget_ms": budget_ms,
            "target": asdict(target),
            "precision": cfg.precision,
            "opset": cfg.opset,
            "parity": {"dataset": asdict(parity) | {"source": source}, "ood": asdict(ood)},
            "lineage": {
                "policy_digest": policy.digest,
                "dataset_digest": dataset.digest if dataset is not None else None,
                "training": policy.algorithm,
                "sim_report_digest": report.digest,
                "suite_digest": report.suite_digest,
                "code_revision": ctx.producer("package", STAGE_VERSION).code_revision,
                "mlflow_model_name": ctx.pipeline.config.promote.model_name,
            },
        }
        bundle_path = work / "bundle.tar"
        pack_policy_bundle(bundle_path, onnx_path, draw_calibration_set(obs, seed=ctx.seed),
                           source, manifest, target)
        crash_point("package.bundle_written")
        run.log_metrics({"parity_max_abs_diff": parity.max_abs_diff,
                         "ood_max_abs_diff": ood.max_abs_diff,
                         "latency_p50_us": latency.p50_us, "latency_p99_us": latency.p99_us})
        run.log_artifact(onnx_path, "onnx")
        bundle = ctx.store.publish(
            bundle_path,
            lambda digest, uri: EdgeBundle(
                digest=digest,
                uri=uri,
                producer=ctx.producer("package", STAGE_VERSION),
                parents=(policy.digest, report.digest),
                mlflow_run_id=run.run_id,
                target=target.name,
                onnx_digest=onnx_digest,
                opset=cfg.opset,
                parity_max_abs_diff=parity.max_abs_diff,
                latency_p50_us=latency.p50_us,
                latency_p99_us=latency.p99_us,
                gates=gates,
                passed=passed,
            ),
        )
        crash_point("package.bundle_published")
        run.set_tags({"physai.bundle.digest": bundle.digest, "physai.gates_passed": passed})
    shutil.rmtree(work, ignore_errors=True)
    log.info("bundle %s: parity %.2e, p99 %.1f us", bundle.digest[:12], parity.max_abs_diff,
             latency.p99_us)
    return bundle
