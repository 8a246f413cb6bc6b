"""The package stage: ONNX export with the normalizer inside, parity, latency, edge bundle.

A policy trained here (an ``.npz`` MLP) is exported to ONNX and checked against PyTorch. A
policy trained elsewhere is already ONNX (:mod:`stages.training.imported`): the bundle carries those
bytes as stored, its parity checked against the stored policy run by ONNX Runtime, the
runtime it was validated with (an imported TorchScript policy was checked against TorchScript
when it was imported); its normalization is recorded as the identity, since whatever
normalizer it has is inside the graph, and its opset is the graph's own.

A policy that sees (:mod:`stages.sim.env.observation`) is checked on real rendered frames: its
training dataset's camera images, or, without a dataset, the frames its task's cameras render
in its own rollouts (:func:`rollout_inputs`). Its graph and bundle carry each camera image it
reads by name (``io.images`` in the manifest), its INT8 calibration set holds those frames, and
its latency is timed with frames of the cameras' real size.

A policy that emits chunks of k actions (ONNX output ``actions`` (batch, k, act_dim)) is
checked chunk for chunk and timed per query (one call, one chunk); its manifest's ``io.chunk``
records how validation ran its chunks (``validate.chunk``,
:func:`stages.evaluation.rollout.chunk_spec`), which the runtime and ``flows bundle drive`` then
run.

A diffusion policy (:class:`~stages.policies.local.DiffusionActor`) runs ``package.denoising_steps``
denoising steps a query (unset: its own): validation's rollouts for the parity inputs, the
parity, the latency gate (one query: history, noise, schedule, the whole denoising loop) and
the manifest's ``io.diffusion`` (the graph's sampling, with those steps), which the runtime
reads. Its parity is checked on :data:`DIFFUSION_PARITY_SAMPLES` of the inputs, each a fresh
history, both sides drawing the same seeded noise.
"""

from __future__ import annotations

import logging
import platform
import shutil
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from physai_core.errors import ConfigError, IntegrityError, PhysaiError
from stages.artifacts.records import Dataset, EdgeBundle, GateResult, Policy, SimReport
from stages.core.crash import crash_point
from stages.core.hashing import sha256_file
from stages.datasets.demonstrations import read_transitions
from stages.evaluation.rollout import chunk_runner, chunk_spec
from stages.orchestration.context import StageContext
from stages.orchestration.envcall import placed, rollout_observations_in
from stages.policies.local import PolicyFn, chunk_size_of, load_actor, load_policy, policy_format
from stages.sections.models import PackageConfig, ValidateConfig
from stages.sim.env.observation import STATE_KEY, observe, policy_inputs
from stages.sim.tasks.catalog import TaskSpec, get_task

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from edge.verify import ParityReport
    from stages.sim.scenes.scene import Scene

Observations = np.ndarray | dict[str, np.ndarray]
"""What parity, calibration and latency run on: the state alone, (N, obs_dim) float32, or for
a policy that sees every input it reads by name (``obs`` and each ``<camera>_image``
(N, H, W, 3) uint8), row i of each one sample."""

log = logging.getLogger(__name__)

STAGE_VERSION = "2"
PARITY_SAMPLES = 4096
OOD_SAMPLES = 1024
PARITY_WORLDS = 32
SEEING_PARITY_WORLDS = 12
"""Worlds of the rollout of a policy that sees and has no dataset: every world's cameras render
each step (5-15 ms a 64 x 64 frame on two cores), so fewer worlds than a state policy's
PARITY_WORLDS; 12 worlds of a 100-step episode give 1200 samples, more than the INT8
calibration set's 1024."""
OOD_TOLERANCE_FACTOR = 10.0
DIFFUSION_PARITY_SAMPLES = 256
"""Inputs a diffusion policy's parity is checked on: each sample is a whole denoising loop."""


def training_dataset(policy: Policy, ctx: StageContext) -> Dataset | None:
    """The dataset ``policy`` was cloned from; None for a policy trained in simulation or
    elsewhere (an imported policy's parent is its source file)."""
    from stages.training.algorithms import IMPORT

    if not policy.parents or policy.algorithm == IMPORT:
        return None
    dataset = ctx.store.get(policy.parents[0])
    if not isinstance(dataset, Dataset):
        raise IntegrityError(f"policy parent {dataset.digest} is a {dataset.kind}, not a dataset")
    return dataset


@dataclass(frozen=True)
class ParityScene:
    """Where a policy with no dataset meets real inputs: the first scene of the validation
    suite, on the suite's backend, run as validation ran it."""

    backend: str
    """The suite's simulator backend."""
    scene: Scene
    """The suite's first scene."""
    seed: int
    """Its seed."""
    validate: ValidateConfig | None
    """The validate section: how a policy that emits chunks executes them."""


def _observations_environment(policy: Policy, ctx: StageContext,
                              where: ParityScene) -> str | None:
    """The stage environment the policy's rollouts run in: its task's own, else the one the
    suite's backend implies, else any."""
    from stages.sim.backends.catalog import get_backend

    return get_task(policy.task).environment or get_backend(where.backend).environment


@placed(_observations_environment, rollout_observations_in)
def rollout_observations(policy: Policy, ctx: StageContext, where: ParityScene) -> np.ndarray:
    """Observations met by ``policy`` driving the first scene of the suite (one episode of
    PARITY_WORLDS worlds): real simulator inputs for a policy that has no dataset.
    Shape: (PARITY_WORLDS * episode_steps, obs_dim)."""
    seen = _rollout(load_actor(ctx.store.open_payload(policy)), policy.task, where,
                    PARITY_WORLDS)
    return np.concatenate(seen)


def rollout_inputs(policy: Policy, ctx: StageContext,
                   where: ParityScene) -> dict[str, np.ndarray]:
    """Every input a policy that sees reads, met driving the first scene of the suite (one
    episode of SEEING_PARITY_WORLDS worlds): the state and the frames its task's cameras
    rendered at each step, the real inputs of a policy that has no dataset. Runs here (a task
    that renders cameras runs in this environment). Shapes: ``obs`` (worlds * episode_steps,
    obs_dim) float32; each ``<camera>_image`` (worlds * episode_steps, H, W, 3) uint8."""
    act = load_actor(ctx.store.open_payload(policy))
    seen = _rollout(act, policy.task, where, SEEING_PARITY_WORLDS)
    return {name: np.concatenate([step[name] for step in seen]) for name in policy_inputs(act)}


def _rollout(act: PolicyFn, task: str, where: ParityScene, worlds: int) -> list[Any]:
    """What ``act`` read at each step of one episode of ``worlds`` worlds in the suite's first
    scene: the observation, or for a policy that sees the mapping of its inputs
    (:func:`stages.sim.env.observation.observe`). A policy that emits chunks runs as validation ran
    it (``validate.chunk``)."""
    from stages.sim.backends.catalog import make_backend_env

    spec = get_task(task)
    step = act if chunk_size_of(act) is None else chunk_runner(act, where.validate)
    env = make_backend_env(where.backend, spec, where.scene, worlds, where.seed)
    try:
        seen = [observe(env, env.reset(), act)]
        for _ in range(env.episode_steps - 1):
            obs, _, _ = env.step(step(seen[-1]))
            seen.append(observe(env, obs, act))
    finally:
        env.close()
    return seen


def package(cfg: PackageConfig, policy: Policy, report: SimReport, ctx: StageContext, *,
            parity_scene: ParityScene, model_name: str) -> EdgeBundle:
    """Export ``policy`` for ``cfg.target``, check it against PyTorch and pack the bundle: 1. the
    target checked, the policy loaded (its chunks run as ``parity_scene.validate`` says); 2. the
    parity inputs drawn (the training dataset's, else its own rollouts in ``parity_scene``); 3.
    the ONNX export checked (parity, latency, gates); 4. the bundle packed, content only, signed
    (:func:`signing_key`), its manifest naming ``model_name``, the model promote registers; 5. the
    :class:`EdgeBundle` record, with measured latency and run ids, logged and published."""
    from edge.calibration import draw_calibration_set
    from edge.pack import pack_policy_bundle
    from edge.targets import get_target, preflight

    # -- 1. target and policy: a target that cannot run the policy stops before any export
    target = get_target(cfg.target)
    spec = get_task(policy.task)
    payload = ctx.store.open_payload(policy)
    given = policy_format(payload) == "onnx"
    opset = _given_opset(payload) if given else cfg.opset
    preflight(target, opset, cfg.precision)
    act = load_actor(payload, cfg.denoising_steps)
    diffusion = _diffusion_spec(act, cfg, ctx.config_path)
    images = image_inputs(spec, act)
    chunk = chunk_spec(act, parity_scene.validate)
    # -- 2. parity inputs: observations the policy really meets, not random ones
    dataset = training_dataset(policy, ctx)
    obs, source = _parity_observations(policy, dataset, ctx, images, parity_scene)
    sample = _drawn(obs, np.random.default_rng(ctx.seed), PARITY_SAMPLES)
    # -- 3. the ONNX export, checked against PyTorch and timed, inside the stage's MLflow run
    work = ctx.scratch / f"package-{policy.digest[:16]}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with ctx.lineage.stage_run(ctx.experiment, "package", ctx.pipeline_run_id, {}) as run:
        run.log_params({**cfg.model_dump(), "device": target.device})
        onnx_path = work / "policy.onnx"
        parity, ood, normalization = _export_checked(cfg, payload, act, sample, onnx_path,
                                                     given=given, opset=opset, obs_dim=spec.obs_dim,
                                                     seed=ctx.seed, images=images)
        latency = _latency(cfg, onnx_path, spec.obs_dim, images, diffusion)
        gates = _gates(cfg, parity, ood, latency, source, chunk, diffusion)
        passed = all(g.passed for g in gates)
        # -- 4. the bundle: content only, so the same policy and report pack the same bytes
        onnx_digest = sha256_file(onnx_path)
        manifest = _manifest(cfg, spec, target, opset, normalization, images, {
            "dataset": asdict(parity) | {"source": source}, "ood": asdict(ood)}, {
            "policy_digest": policy.digest,
            "dataset_digest": dataset.digest if dataset is not None else None,
            "training": policy.algorithm,
            "sim_report_digest": report.digest,
            "suite_digest": report.suite_digest,
            "code_revision": ctx.producer("package", STAGE_VERSION).code_revision,
            "mlflow_model_name": model_name,
        }, chunk=chunk, diffusion=diffusion)
        bundle_path = work / "bundle.tar"
        pack_policy_bundle(bundle_path, onnx_path, draw_calibration_set(obs, seed=ctx.seed),
                           source, manifest, target, signing_key=signing_key(ctx))
        crash_point("package.bundle_written")
        # -- 5. what varies run to run (latency, run ids) goes to MLflow and the record
        run.log_metrics({"parity_max_abs_diff": parity.max_abs_diff,
                         "ood_max_abs_diff": ood.max_abs_diff,
                         "latency_p50_us": latency.p50_us, "latency_p99_us": latency.p99_us})
        run.log_artifact(onnx_path, "onnx")
        bundle = ctx.publish(
            bundle_path, EdgeBundle, "package", STAGE_VERSION, (policy.digest, report.digest),
            run.run_id,
            target=target.name,
            onnx_digest=onnx_digest,
            opset=opset,
            parity_max_abs_diff=parity.max_abs_diff,
            latency_p50_us=latency.p50_us,
            latency_p99_us=latency.p99_us,
            gates=gates,
            passed=passed,
        )
        crash_point("package.bundle_published")
        run.set_tags({"physai.bundle.digest": bundle.digest, "physai.gates_passed": passed})
    shutil.rmtree(work, ignore_errors=True)
    log.info("bundle %s: parity %.2e, p99 %.1f us", bundle.digest[:12], parity.max_abs_diff,
             latency.p99_us)
    return bundle


def image_inputs(spec: TaskSpec, act: Any) -> dict[str, tuple[int, int, int]]:
    """The camera images ``act`` reads, in its input order: name -> one frame's (height,
    width, 3) as the task's cameras render it; empty for a state policy. A policy reading
    anything else (a depth image, a camera the task lacks) is refused in one line: a bundle
    carries the state and the colour images of the task's cameras."""
    frames = {cam.image_key: (cam.height, cam.width, 3) for cam in spec.cameras if cam.rgb}
    names = [name for name in policy_inputs(act) if name != STATE_KEY]
    other = [name for name in names if name not in frames]
    if other:
        raise PhysaiError(f"task {spec.name!r}: the policy reads {', '.join(other)}; a bundle "
                          f"carries the state and the colour images of the task's cameras "
                          f"({', '.join(frames) or 'none'})")
    return {name: frames[name] for name in names}


def _drawn(obs: Observations, rng: np.random.Generator, samples: int) -> Observations:
    """``samples`` rows (all when there are fewer) drawn without replacement from ``obs``,
    the same rows of every input of a mapping."""
    count = len(obs[STATE_KEY] if isinstance(obs, dict) else obs)
    rows = rng.choice(count, min(samples, count), replace=False)
    return {name: array[rows] for name, array in obs.items()} if isinstance(obs, dict) \
        else obs[rows]


def _parity_observations(policy: Policy, dataset: Dataset | None, ctx: StageContext,
                         images: Mapping[str, tuple[int, int, int]],
                         scene: ParityScene) -> tuple[Observations, str]:
    """The inputs parity is checked on, and where they come from: the training dataset's,
    else the policy's own rollouts in the first suite scene; for a policy that sees, with the
    camera frames of the same samples (``images`` names them), rendered by the task's env."""
    spec = get_task(policy.task)
    cameras = [cam for cam in spec.cameras if cam.image_key in images]
    if dataset is not None:
        data = read_transitions(ctx.store.open_payload(dataset), spec.obs_dim, spec.act_dim,
                                cameras=cameras)
        if not images:
            return data.obs, "dataset observations"
        return ({STATE_KEY: data.obs, **{name: data.images[name] for name in images}},
                "dataset observations and their camera frames")
    where = "of the policy's own rollouts in the first suite scene"
    if not images:
        return rollout_observations(policy, ctx, scene), f"observations {where}"
    return rollout_inputs(policy, ctx, scene), f"observations and rendered camera frames {where}"


def _export_checked(cfg: PackageConfig, payload: Path, act: PolicyFn, sample: Observations,
                    onnx_path: Path, *, given: bool, opset: int, obs_dim: int, seed: int,
                    images: Mapping[str, tuple[int, int, int]],
                    ) -> tuple[ParityReport, ParityReport, dict[str, list[float]]]:
    """Write the policy's ONNX file (a given ONNX policy is copied, a PyTorch one exported
    with the image inputs ``images``) and check it against the policy on ``sample`` and on
    out-of-distribution probes (for a policy that sees, with frames of random pixels);
    returns both reports and the normalization baked into the model."""
    from edge.export import export_onnx
    from edge.verify import check_parity, ood_inputs, ood_probes

    probes = ood_inputs(sample, OOD_SAMPLES, seed) if isinstance(sample, dict) \
        else ood_probes(sample, OOD_SAMPLES, seed)
    ood_tolerance = cfg.parity_tolerance * OOD_TOLERANCE_FACTOR
    if given:
        shutil.copyfile(payload, onnx_path)
        crash_point("package.exported")
        if chunk_size_of(act) is not None and hasattr(act, "sampler"):
            return (diffusion_parity(payload, onnx_path, sample, cfg.parity_tolerance,
                                     cfg.denoising_steps),
                    diffusion_parity(payload, onnx_path, probes, ood_tolerance,
                                     cfg.denoising_steps),
                    {"obs_mean": [0.0] * obs_dim, "obs_std": [1.0] * obs_dim})
        return (given_parity(act, onnx_path, sample, cfg.parity_tolerance),
                given_parity(act, onnx_path, probes, ood_tolerance),
                {"obs_mean": [0.0] * obs_dim, "obs_std": [1.0] * obs_dim})
    module, _ = load_policy(payload)
    export_onnx(module, obs_dim, onnx_path, opset=opset, images=images or None)
    crash_point("package.exported")
    return (check_parity(module, onnx_path, sample, tolerance=cfg.parity_tolerance),
            check_parity(module, onnx_path, probes, tolerance=ood_tolerance),
            {"obs_mean": module.state_dict()["obs_mean"].tolist(),
             "obs_std": module.state_dict()["obs_std"].tolist()})


def _gates(cfg: PackageConfig, parity: ParityReport, ood: ParityReport, latency: Any,
           source: str, chunk: Mapping[str, Any] | None = None,
           diffusion: Mapping[str, Any] | None = None) -> tuple[GateResult, ...]:
    """The package stage's gates: parity on the sample, parity out of distribution, p99
    latency within the budget. For a policy that emits chunks (``chunk``, the manifest's
    ``io.chunk``) parity compares whole chunks and latency is of one query, one chunk; for a
    diffusion policy (``diffusion``, its ``io.diffusion``) a query runs its denoising steps."""
    limit = min(cfg.max_latency_p99_ms, 1000.0 / cfg.control_hz)
    per = f" per query (one chunk of {chunk['size']} actions)" if chunk else ""
    if diffusion is not None:
        per += f" with {diffusion['steps']} denoising steps"
    return (
        GateResult(name="parity/dataset", measured=parity.max_abs_diff,
                   threshold=cfg.parity_tolerance, passed=parity.passed,
                   detail=f"{parity.samples} {source}" + (", whole chunks" if chunk else "")),
        GateResult(name="parity/ood", measured=ood.max_abs_diff, threshold=ood.tolerance,
                   passed=ood.passed, detail=f"{ood.samples} out-of-distribution probes"),
        GateResult(name="latency/p99_ms", measured=latency.p99_us / 1000, threshold=limit,
                   passed=latency.p99_us / 1000 <= limit,
                   detail=f"ONNX Runtime CPU batch 1{_timed(latency)}{per}, {latency.iters} "
                          f"runs, "
                          f"measured "
                          f"on the packaging host {platform.node()} ({platform.machine()}), "
                          f"not on {cfg.target}"),
    )


def _timed(latency: Any) -> str:
    """The timed inputs of a policy that sees, e.g. `` at obs + front_image 64x64x3 uint8``;
    nothing for a state policy."""
    return f" at {latency.inputs()}" if latency.images else ""


def _manifest(cfg: PackageConfig, spec: Any, target: Any, opset: int,
              normalization: dict[str, list[float]], images: Mapping[str, tuple[int, int, int]],
              parity: dict[str, Any], lineage: dict[str, Any], *,
              chunk: Mapping[str, Any] | None = None,
              diffusion: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The bundle manifest's content (edge/manifest.py checks its schema); ``io.images``
    names each camera image the policy reads, in its input order (none for a state policy);
    for a policy that emits chunks of k actions, ``io.chunk`` is how validation ran them
    (``chunk``) and the actions are ['batch', k, act_dim]; a diffusion policy's sampling is
    ``io.diffusion`` (``diffusion``)."""
    cameras = {cam.image_key: cam.name for cam in spec.cameras}
    seen = [{"name": name, "shape": ["batch", *shape], "dtype": "uint8", "layout": "HWC",
             "channels": "RGB", "camera": cameras[name]} for name, shape in images.items()]
    per = [chunk["size"]] if chunk else []
    return {
        "task": spec.name,
        "io": {
            "obs": {"name": "obs", "shape": ["batch", spec.obs_dim], "dtype": "float32",
                    "names": list(spec.obs_names), "units": list(spec.obs_units)},
            "actions": {"name": "actions", "shape": ["batch", *per, spec.act_dim],
                        "dtype": "float32", "names": list(spec.action_names),
                        "units": list(spec.action_units), "range": [-1.0, 1.0]},
        } | ({"images": seen} if seen else {}) | ({"chunk": dict(chunk)} if chunk else {})
        | ({"diffusion": dict(diffusion)} if diffusion is not None else {}),
        "normalization": {"baked_into_model": True, **normalization},
        "control_hz": cfg.control_hz,
        "latency_budget_ms": 1000.0 / cfg.control_hz,
        "target": asdict(target),
        "precision": cfg.precision,
        "opset": opset,
        "parity": parity,
        "lineage": lineage,
    }


def _diffusion_spec(act: Any, cfg: PackageConfig, where: Path) -> dict[str, Any] | None:
    """A diffusion policy's sampling as the manifest's ``io.diffusion`` records it, its steps
    ``cfg.denoising_steps`` (unset: its own); None for any other policy, for which a
    ``denoising_steps`` setting is a one-line error naming the config file ``where``."""
    sampler = getattr(act, "sampler", None)
    if sampler is None:
        if cfg.denoising_steps is not None:
            raise ConfigError.one(where, "package.denoising_steps", cfg.denoising_steps,
                                  "only a diffusion policy has denoising steps; remove it")
        return None
    return dict(sampler.spec, steps=sampler.steps)


def _latency(cfg: PackageConfig, onnx_path: Path, obs_dim: int,
             images: Mapping[str, tuple[int, int, int]],
             diffusion: Mapping[str, Any] | None) -> Any:
    """The latency of one query at batch 1: one graph call, or a diffusion policy's whole
    query with its denoising steps (:func:`edge.bench.diffusion_latency`)."""
    from edge.bench import diffusion_latency, onnx_latency

    if diffusion is not None:
        return diffusion_latency(onnx_path, obs_dim, steps=int(diffusion["steps"]),
                                 iters=cfg.latency_iters, images=images)
    return onnx_latency(onnx_path, obs_dim, iters=cfg.latency_iters, images=images)


def diffusion_parity(stored: Path, onnx_path: Path, obs: Observations, tolerance: float,
                     steps: int | None) -> ParityReport:
    """Parity of the bundle's diffusion graph against the stored one, both sampled by fresh
    :class:`~stages.policies.local.DiffusionActor` s with ``steps`` denoising steps, so both
    draw the same seeded noise, on the first :data:`DIFFUSION_PARITY_SAMPLES` of ``obs``
    (each a fresh history: its frame repeated). Whole chunks are compared; a non-finite
    action counts as an infinite difference."""
    from edge.verify import ParityReport
    from stages.policies.local import onnx_actor

    rows = {name: np.asarray(array)[:DIFFUSION_PARITY_SAMPLES] for name, array in obs.items()} \
        if isinstance(obs, dict) else {STATE_KEY: np.asarray(obs)[:DIFFUSION_PARITY_SAMPLES]}
    given: Any = rows
    expected = np.asarray(onnx_actor(stored, steps)(given), np.float64)
    actual = np.asarray(onnx_actor(onnx_path, steps)(given), np.float64)
    finite = np.isfinite(expected) & np.isfinite(actual)
    diff = np.where(finite, np.abs(expected - actual), np.inf)
    max_abs = float(diff.max())
    return ParityReport(max_abs_diff=max_abs, mean_abs_diff=float(diff.mean()),
                        samples=len(rows[STATE_KEY]), tolerance=tolerance,
                        passed=max_abs <= tolerance)


def signing_key(ctx: StageContext) -> Path:
    """The private key every bundle is signed with: the file ``PHYSAI_SIGNING_KEY`` names,
    else the project's own, created once under the state folder
    (:func:`stages.steps.bundles.project_signing_key`). Only its path is handled here; it is never
    logged or recorded."""
    from edge.pack import signing_key_from_environment
    from stages.steps.bundles import project_signing_key

    return signing_key_from_environment() or project_signing_key(ctx.settings)


def _given_opset(path: Path) -> int:
    """The default-domain opset of the stored ONNX policy at ``path``."""
    import onnx

    from edge.export import model_opset

    return model_opset(onnx.load(str(path), load_external_data=False))


def given_parity(act: PolicyFn, onnx_path: Path, obs: Observations, tolerance: float
                 ) -> ParityReport:
    """Parity of the bundle's ONNX file against ``act``, the stored policy as validated.

    Both run on ONNX Runtime here; the check proves the bundle holds the network that was
    validated and that its actions are finite on these inputs (a non-finite action counts as
    an infinite difference, as in :func:`edge.verify.check_parity`). For a policy that sees,
    ``obs`` maps every input it reads to its samples, and both are given them by name.
    """
    from edge.session import open_session
    from edge.verify import ParityReport, parity_inputs

    session = open_session(onnx_path, threads=1)
    inputs = parity_inputs(onnx_path, session, obs)
    count = len(inputs[STATE_KEY])
    given: Any = inputs if session.images else inputs[STATE_KEY]
    expected = np.asarray(act(given), np.float64)
    fixed = session.session.get_inputs()[0].shape[0]
    step = fixed if isinstance(fixed, int) else count
    chunks = ({name: array[i : i + step] for name, array in inputs.items()}
              for i in range(0, count, step))
    actual = np.concatenate([session.run(chunk if session.images else chunk[STATE_KEY])
                             for chunk in chunks]).astype(np.float64)
    finite = np.isfinite(expected) & np.isfinite(actual)
    diff = np.where(finite, np.abs(expected - actual), np.inf)
    max_abs = float(diff.max())
    return ParityReport(max_abs_diff=max_abs, mean_abs_diff=float(diff.mean()),
                        samples=count, tolerance=tolerance, passed=max_abs <= tolerance)
