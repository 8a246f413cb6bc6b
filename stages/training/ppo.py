"""PPO in the batched simulator through rsl_rl, with checkpoints that survive a killed run.

The algorithm is rsl_rl's :class:`~rsl_rl.algorithms.PPO` (the one Isaac Lab trains with): its
actor-critic, rollout storage, GAE, clipped surrogate and adaptive learning rate. This module
drives it: it steps the batched MuJoCo worlds through :class:`~stages.training.rl_env.RslRlEnv`,
logs metrics to MLflow in batches, shows a progress bar, writes a checkpoint to the artifact
store every ``checkpoint_every`` iterations, and resumes from the newest one when the same
stage (same config, same scene) is run again after a crash.

Under ``torchrun`` (``WORLD_SIZE`` > 1) every process steps its own worlds with its own seed
and rsl_rl averages the gradients and normalizer statistics across processes (gloo on CPU,
NCCL on GPUs), so all ranks keep identical parameters; rank 0 alone writes to MLflow and the
store, and the run ends with a check that every rank holds the same parameters.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from physai_core.errors import BackendUnavailableError, IntegrityError, PhysaiError
from stages.artifacts.records import Checkpoint, Policy
from stages.core.hashing import sha256_json
from stages.orchestration.context import StageContext, resolve_device
from stages.policies.local import build_policy, save_policy
from stages.sections.models import PPOConfig

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure
    from rsl_rl.algorithms import PPO

    from stages.artifacts.records import Dataset
    from stages.sim.scenes.scene import Scene
    from stages.training.context import TrainingContext
    from stages.training.pipelined_ppo import PipelinedPPO

log = logging.getLogger(__name__)

STAGE_VERSION = "1"

FLUSH_EVERY = 10
"""Iterations between batched metric uploads to MLflow (13 metrics per iteration)."""

METRIC_WINDOW_EPISODES = 2
"""Finished episodes per world averaged into the logged return and fall rate."""


@dataclass(frozen=True)
class DistInfo:
    """This process's place in a ``torchrun`` job (rank 0 of 1 when run alone)."""

    rank: int
    local_rank: int
    world_size: int
    device: str

    @property
    def is_main(self) -> bool:
        """True on the process that writes to MLflow and the store."""
        return self.rank == 0


def init_distributed(requested_device: str) -> DistInfo:
    """Join the ``torchrun`` process group when ``WORLD_SIZE`` > 1 (gloo on CPU, NCCL on CUDA).

    The device ``auto`` becomes ``cuda:LOCAL_RANK`` when GPUs are visible, else ``cpu``.
    """
    device = resolve_device(requested_device)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world_size == 1:
        return DistInfo(0, 0, 1, device)
    import torch
    import torch.distributed as dist

    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return DistInfo(rank, local_rank, world_size, device)


def run_key(stage: str, ctx: StageContext) -> str:
    """What decides a PPO run's result: stage version, config and scene digests (not whether
    it runs as ``train`` or ``teacher``, nor the pipeline's name).

    Checkpoints are filed under it, so a re-run of the same stage finds them and a changed
    config starts afresh.
    """
    return sha256_json({"stage": "ppo", "version": STAGE_VERSION,
                        "config": ctx.config_digests[stage]})


def checkpoint_ref(stage: str, ctx: StageContext) -> str:
    """Name of the store reference to the newest checkpoint of this stage's run."""
    return f"checkpoints/ppo/{run_key(stage, ctx)}"


def latest_checkpoint(stage: str, ctx: StageContext) -> Checkpoint | None:
    """The newest checkpoint of this stage's run, verified, or None."""
    digest = ctx.store.get_ref(checkpoint_ref(stage, ctx))
    if digest is None:
        return None
    checkpoint = ctx.store.get(digest)
    if not isinstance(checkpoint, Checkpoint) or checkpoint.run_key != run_key(stage, ctx):
        raise IntegrityError(f"{checkpoint_ref(stage, ctx)} points at {digest}, which is not a "
                             "checkpoint of this run")
    ctx.store.open_payload(checkpoint)
    return checkpoint


def rsl_rl_config(cfg: PPOConfig, dist: DistInfo) -> dict[str, Any]:
    """The rsl_rl runner configuration for ``cfg``."""
    model = {"class_name": "MLPModel", "hidden_dims": list(cfg.hidden), "activation": "elu",
             "obs_normalization": True}
    distribution: dict[str, Any] = {"class_name": "GaussianDistribution",
                                    "init_std": cfg.init_noise_std}
    if cfg.noise_correlation > 0 or cfg.pipelined:  # pipelined: the collector's own draws
        distribution = {"class_name": "stages.training.rl_noise:CorrelatedGaussian",
                        "init_std": cfg.init_noise_std, "correlation": cfg.noise_correlation}
    return {
        "num_steps_per_env": cfg.steps_per_iteration,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": cfg.learning_epochs,
            "num_mini_batches": cfg.mini_batches,
            "clip_param": cfg.clip,
            "gamma": cfg.gamma,
            "lam": cfg.lam,
            "value_loss_coef": 1.0,
            "entropy_coef": cfg.entropy_coef,
            "learning_rate": cfg.lr,
            "max_grad_norm": cfg.max_grad_norm,
            "schedule": "adaptive",
            "desired_kl": cfg.desired_kl,
        },
        "actor": {**model, "distribution_cfg": distribution},
        "critic": model,
        "multi_gpu": None if dist.world_size == 1 else {
            "global_rank": dist.rank, "local_rank": dist.local_rank,
            "world_size": dist.world_size},
    }


def train_ppo(cfg: PPOConfig, ctx: TrainingContext, *, stage: str = "train") -> Policy:
    """Train a policy with PPO in the stage's scene; resume from a checkpoint if one exists.

    Args:
        cfg: The stage's PPO config.
        ctx: The pipeline run's services, the task and the stage's scene.
        stage: ``train`` or ``teacher``: which of the pipeline's stages this is.

    Returns:
        The published policy (on every rank of a ``torchrun`` job; only rank 0 publishes).
    """
    import torch

    try:
        from rsl_rl.algorithms import PPO

        from stages.training.rl_env import RslRlEnv
    except ImportError as exc:
        raise BackendUnavailableError("rsl_rl", "rl", exc) from None

    dist = init_distributed(cfg.device)
    scene, scene_digest = _stage_scene(stage, ctx)
    spec = ctx.task
    checkpoint = latest_checkpoint(stage, ctx)
    start = checkpoint.iteration if checkpoint is not None else 0
    attempts = checkpoint.attempts if checkpoint is not None else ()
    if start >= cfg.iterations:
        start = cfg.iterations  # a checkpoint of the last iteration: only publishing is left
    seed = ctx.seed * 1_000_003 + dist.rank * 7919 + start
    torch.manual_seed(seed)
    env = spec.make_env(scene, cfg.num_worlds, seed, num_threads=cfg.sim_threads)
    venv = RslRlEnv(env, dist.device)
    rsl_cfg = rsl_rl_config(cfg, dist)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        alg = PPO.construct_algorithm(venv.get_observations(), venv, rsl_cfg, dist.device)
    log.debug("rsl_rl: %s", printed.getvalue())
    if checkpoint is not None:
        state = torch.load(ctx.store.open_payload(checkpoint), map_location=dist.device,
                           weights_only=True)
        alg.load(state, None, strict=True)
    if dist.world_size > 1:
        alg.broadcast_parameters()
    pipe = None
    if cfg.pipelined:
        from stages.training.pipelined_ppo import PipelinedPPO

        pipe = PipelinedPPO(alg, venv, rsl_cfg, dist.device, seed)

    with _main_run(ctx, stage, dist) as run:
        if run is not None:
            attempts = (*attempts, run.run_id)
            run.log_params({**cfg.model_dump(exclude={"resources"}), "algorithm": "ppo",
                            "device": dist.device, "world_size": dist.world_size,
                            "scene": scene.config.name, "rsl_rl": _rsl_rl_version(),
                            **{f"resources.{k}": v
                               for k, v in cfg.resources.model_dump().items()}})
            tags: dict[str, object] = {"physai.algorithm": "ppo",
                                       "physai.run_key": run_key(stage, ctx)}
            if checkpoint is not None:
                tags |= {"physai.resumed_from.checkpoint": checkpoint.digest,
                         "physai.resumed_from.iteration": checkpoint.iteration,
                         "physai.previous_attempts": ",".join(checkpoint.attempts)}
                log.info("%s: resuming from checkpoint %s at iteration %d of %d", stage,
                         checkpoint.digest[:12], checkpoint.iteration, cfg.iterations)
                for attempt in checkpoint.attempts:
                    if ctx.lineage.end_abandoned(attempt):
                        log.info("%s: attempt %s died; its run is marked KILLED", stage, attempt)
            run.set_tags(tags)
        curve = _learn(alg, venv, cfg, ctx, dist, run, stage, start, attempts, pipe)
        policy = _publish(alg, cfg, ctx, dist, run, stage, scene_digest, curve, attempts)
    env.close()
    return policy


def _learn(
    alg: PPO, venv: Any, cfg: PPOConfig, ctx: StageContext, dist: DistInfo, run: Any, stage: str,
    start: int, attempts: tuple[str, ...], pipe: PipelinedPPO | None = None,
) -> list[dict[str, float]]:
    """The rollout-update loop from iteration ``start`` (pipelined through ``pipe`` when
    given); returns the logged metrics."""

    window = METRIC_WINDOW_EPISODES * venv.num_envs
    returns: deque[float] = deque(maxlen=window)
    lengths: deque[int] = deque(maxlen=window)
    falls: deque[bool] = deque(maxlen=window)
    success = math.nan
    curve: list[dict[str, float]] = []
    obs = venv.get_observations()
    alg.train_mode()
    steps = cfg.steps_per_iteration * venv.num_envs * dist.world_size
    progress = ctx.progress if dist.is_main else None
    bar_cm = progress.bar(stage, cfg.iterations) if progress else contextlib.nullcontext()
    with bar_cm as bar:
        if bar is not None and start:
            bar.advance(start, resumed=start)
        for it in range(start, cfg.iterations):
            cap_noise(alg, cfg, it)
            began = time.perf_counter()
            if pipe is None:
                obs, losses, collect_s, learn_s = ppo_iteration(
                    alg, venv, obs, cfg.steps_per_iteration, cfg.update_threads)
            else:
                obs, losses, collect_s, learn_s = pipelined_iteration(pipe, obs, cfg, it)
            seconds = time.perf_counter() - began
            finished = venv.pop_episode_stats()
            returns.extend(finished[0])
            lengths.extend(finished[1])
            falls.extend(finished[2])
            if finished[3]:
                success = float(np.mean(finished[3]))
            metrics = {
                "mean_return": float(np.mean(returns)) if returns else math.nan,
                "mean_episode_length": float(np.mean(lengths)) if lengths else math.nan,
                "fall_rate": float(np.mean(falls)) if falls else math.nan,
                "success_rate": success,
                "value_loss": losses["value"],
                "surrogate_loss": losses["surrogate"],
                "entropy": losses["entropy"],
                "action_std": float(alg.get_policy().output_std.detach().mean()),
                "learning_rate": alg.learning_rate,
                "steps_per_second": steps / seconds,
                "collect_seconds": collect_s,
                "learn_seconds": learn_s,
                "env_steps": float(steps * (it + 1)),
            }
            curve.append(metrics)
            done = it + 1
            if run is not None:
                run.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)}, step=it)
                if done % FLUSH_EVERY == 0:
                    run.flush()  # one batched call: the MLflow UI follows the run live
            if dist.is_main and done % cfg.checkpoint_every == 0 and done < cfg.iterations:
                _save_checkpoint(alg, ctx, stage, done, attempts, run)
            if bar is not None:
                bar.advance(1, reward=f"{metrics['mean_return']:.1f}",
                            fall=f"{metrics['fall_rate']:.2f}", success=f"{success:.2f}",
                            sps=f"{metrics['steps_per_second']:.0f}")
    return curve


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block on ``n`` torch threads, then restore the count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def ppo_iteration(
    alg: PPO, venv: Any, obs: Any, steps: int, update_threads: int = 1
) -> tuple[Any, dict[str, float], float, float]:
    """One PPO iteration: a rollout of ``steps`` control steps in every world, then the update.

    The rollout runs torch on one CPU thread: the simulator's C threads own the cores then,
    and OpenMP workers spinning beside them slow both. The update runs on ``update_threads``:
    more than one speeds a CPU update up on an idle machine, but beside any other load the
    waiting workers slow it tenfold and more. On a GPU the update needs no CPU threads.

    Returns:
        The next observation, rsl_rl's mean losses, rollout seconds and update seconds.
    """
    import torch

    t0 = time.perf_counter()
    with torch.inference_mode(), torch_threads(1):
        for _ in range(steps):
            actions = alg.act(obs)
            obs, rewards, dones, extras = venv.step(actions)
            alg.process_env_step(obs, rewards, dones, extras)
        t1 = time.perf_counter()
        alg.compute_returns(obs)
    with torch_threads(update_threads):
        losses = alg.update()
    return obs, losses, t1 - t0, time.perf_counter() - t1


def pipelined_iteration(
    pipe: PipelinedPPO, obs: Any, cfg: PPOConfig, it: int
) -> tuple[Any, dict[str, float], float, float]:
    """Iteration ``it`` of a pipelined run (:mod:`stages.training.pipelined_ppo`): the update, with
    the next rollout collected beside it, all of torch on one CPU thread (the update's and the
    collection's threads share the cores with the simulator's)."""
    with torch_threads(1):
        return pipe.iteration(obs, cfg.steps_per_iteration, it,
                              collect_next=it + 1 < cfg.iterations,
                              cap=lambda collector, i: cap_noise(collector, cfg, i))


def noise_cap(cfg: PPOConfig, iteration: int) -> float | None:
    """The action-noise std cap at ``iteration`` (see ``PPOConfig.final_noise_std``)."""
    if cfg.final_noise_std is None:
        return None
    progress = min(1.0, iteration / max(1.0, 0.75 * cfg.iterations))
    return float(cfg.init_noise_std * (cfg.final_noise_std / cfg.init_noise_std) ** progress)


def cap_noise(alg: PPO, cfg: PPOConfig, iteration: int) -> None:
    """Clamp the actor's learned noise std to :func:`noise_cap` (no-op without a cap)."""
    import torch

    cap = noise_cap(cfg, iteration)
    if cap is None:
        return
    with torch.no_grad():
        alg.get_policy().distribution.std_param.clamp_(max=cap)


def _save_checkpoint(
    alg: PPO, ctx: StageContext, stage: str, iteration: int, attempts: tuple[str, ...], run: Any
) -> Checkpoint:
    """Publish the training state and point the stage's checkpoint reference at it."""
    import torch

    path = ctx.scratch / f"checkpoint-{stage}-{os.getpid()}.pt"
    torch.save({**alg.save(), "iteration": iteration}, path)
    key = run_key(stage, ctx)
    checkpoint = ctx.store.publish(
        path,
        lambda digest, uri: Checkpoint(
            digest=digest, uri=uri, producer=ctx.producer(stage, STAGE_VERSION), parents=(),
            mlflow_run_id=run.run_id if run is not None else None, stage=stage,
            iteration=iteration, run_key=key, attempts=attempts),
    )
    path.unlink()
    ctx.store.set_ref(checkpoint_ref(stage, ctx), checkpoint.digest)
    if run is not None:
        run.set_tags({"physai.checkpoint.digest": checkpoint.digest,
                      "physai.checkpoint.iteration": iteration})
    log.debug("%s: checkpoint %s at iteration %d", stage, checkpoint.digest[:12], iteration)
    return checkpoint


def _publish(
    alg: PPO, cfg: PPOConfig, ctx: TrainingContext, dist: DistInfo, run: Any, stage: str,
    scene_digest: str, curve: list[dict[str, float]], attempts: tuple[str, ...],
) -> Policy:
    """Turn the actor into a deployable policy, check rank agreement, publish it (rank 0)."""
    spec = ctx.task
    module = actor_to_policy(alg, spec.obs_dim, spec.act_dim, cfg.hidden)
    digests = _gather_param_digests(alg, dist)
    log.info("%s: rank %d of %d holds parameters %s", stage, dist.rank, dist.world_size,
             digests[dist.rank][:16])
    if len(set(digests)) != 1:
        raise IntegrityError(f"{stage}: ranks disagree on parameters: {digests}")
    meta = {"obs_dim": spec.obs_dim, "act_dim": spec.act_dim, "hidden": list(cfg.hidden),
            "task": spec.name, "output": "clip"}
    path = ctx.scratch / f"policy-{stage}-{os.getpid()}-{dist.rank}.npz"
    save_policy(module, path, meta)
    final_return = next((c["mean_return"] for c in reversed(curve)
                         if math.isfinite(c["mean_return"])), None)

    def make(digest: str, uri: str) -> Policy:
        return Policy(
            digest=digest, uri=uri, producer=ctx.producer(stage, STAGE_VERSION), parents=(),
            mlflow_run_id=run.run_id if run is not None else None, task=spec.name,
            obs_dim=spec.obs_dim, act_dim=spec.act_dim, hidden=cfg.hidden, algorithm="ppo",
            scene_digest=scene_digest, mean_return=final_return, attempts=attempts)

    if not dist.is_main:
        from stages.core.hashing import sha256_file

        policy = make(sha256_file(path), "")
        path.unlink()
        return policy
    policy = ctx.store.publish(path, make)
    path.unlink()
    if run is not None:
        if curve:
            run.log_figure(learning_curve(curve, stage), "learning_curve.png")
        run.set_tags({"physai.policy.digest": policy.digest,
                      "physai.rank_param_digests": ",".join(digests),
                      "physai.attempts": ",".join(attempts)})
    log.info("%s: PPO policy %s, mean return %s", stage, policy.digest[:12], final_return)
    return policy


def actor_to_policy(
    alg: PPO, obs_dim: int, act_dim: int, hidden: tuple[int, ...]
) -> torch.nn.Module:
    """The actor's deterministic output (the Gaussian mean, clipped to [-1, 1]) as a
    :func:`~stages.policies.local.build_policy` module with rsl_rl's normalizer folded in."""
    import torch

    actor = alg.get_policy()
    norm = actor.obs_normalizer
    mean = norm.mean.detach().cpu().numpy()
    std = (norm.std + norm.eps).detach().cpu().numpy()
    module = build_policy(obs_dim, act_dim, hidden, mean, std, output="clip")
    linear_src = [m for m in actor.mlp.modules() if isinstance(m, torch.nn.Linear)]
    linear_dst = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    if len(linear_src) != len(linear_dst):
        raise IntegrityError(f"actor has {len(linear_src)} linear layers, "
                             f"expected {len(linear_dst)}")
    with torch.no_grad():
        for src, dst in zip(linear_src, linear_dst, strict=True):
            dst.weight.copy_(src.weight.cpu())
            dst.bias.copy_(src.bias.cpu())
    return module.eval()


def _gather_param_digests(alg: PPO, dist: DistInfo) -> list[str]:
    """Digest of actor and critic parameters and normalizers on every rank, in rank order."""
    import torch

    state = {**{f"actor.{k}": v for k, v in alg.get_policy().state_dict().items()},
             **{f"critic.{k}": v for k, v in alg.critic.state_dict().items()}}
    mine = sha256_json({k: v.detach().cpu().numpy().tobytes().hex() for k, v in state.items()})
    if dist.world_size == 1:
        return [mine]
    out: list[Any] = [None] * dist.world_size
    torch.distributed.all_gather_object(out, mine)
    return [str(d) for d in out]


@contextlib.contextmanager
def _main_run(ctx: StageContext, stage: str, dist: DistInfo) -> Iterator[Any]:
    """The stage's MLflow run on rank 0; None on the other ranks."""
    if not dist.is_main:
        yield None
        return
    with ctx.lineage.stage_run(ctx.experiment, stage, ctx.pipeline_run_id, {}) as run:
        yield run


def _stage_scene(stage: str, ctx: TrainingContext) -> tuple[Scene, str]:
    """The scene and scene digest the stage trains in."""
    if ctx.scene is None or ctx.scene_digest is None:
        raise PhysaiError(f"pipeline {ctx.experiment} has no PPO {stage} stage")
    return ctx.scene, ctx.scene_digest


def _rsl_rl_version() -> str:
    from importlib.metadata import version

    return version("rsl-rl-lib")


def learning_curve(curve: list[dict[str, float]], stage: str) -> Figure:
    """Mean episode return and fall rate against simulated steps."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.5), dpi=100)
    ax = fig.add_subplot()
    steps = np.array([c["env_steps"] for c in curve]) / 1e6
    ax.plot(steps, [c["mean_return"] for c in curve], color="tab:blue")
    ax.set_xlabel("simulated steps (millions)")
    ax.set_ylabel("mean episode return", color="tab:blue")
    twin = ax.twinx()
    twin.plot(steps, [c["fall_rate"] for c in curve], color="tab:red", label="fall rate")
    twin.plot(steps, [c["success_rate"] for c in curve], color="tab:green",
              label="success rate (training scene)")
    twin.set_ylabel("fraction of episodes")
    twin.legend(loc="center right", fontsize="small")
    twin.set_ylim(0, 1)
    ax.set_title(f"PPO ({stage})")
    fig.tight_layout()
    return fig


def train_stage(cfg: PPOConfig, ctx: TrainingContext, stage: str,
                dataset: Dataset | None) -> Policy:
    """The ``ppo`` algorithm's entry in :mod:`stages.training.algorithms` (it reads no dataset)."""
    return train_ppo(cfg, ctx, stage=stage)
