"""The train stage: behaviour cloning in PyTorch with observation normalization."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from stages.artifacts import Dataset, Policy
from stages.context import StageContext, resolve_device
from stages.crash import crash_point
from stages.data import read_transitions
from stages.policy import build_policy, save_policy
from stages.sections import TrainConfig
from stages.sim.tasks import get_task

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
MIN_STD = 1e-3


def train(cfg: TrainConfig, dataset: Dataset, ctx: StageContext) -> Policy:
    """Fit an MLP to the dataset's expert actions (MSE), holding out whole episodes for val loss."""
    import torch

    spec = get_task(dataset.task)
    data = read_transitions(ctx.store.open_payload(dataset), spec.obs_dim, spec.act_dim)
    device = resolve_device(cfg.device)
    torch.manual_seed(ctx.seed)
    rng = np.random.default_rng(ctx.seed)

    n_episodes = int(data.episode_index.max()) + 1
    val_episodes = rng.choice(n_episodes, max(1, round(n_episodes * cfg.val_fraction)), False)
    is_val = np.isin(data.episode_index, val_episodes)
    mean = data.obs[~is_val].mean(axis=0)
    std = np.maximum(data.obs[~is_val].std(axis=0), MIN_STD)
    model = build_policy(spec.obs_dim, spec.act_dim, cfg.hidden, mean, std).to(device)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=cfg.epochs)
    obs_t = torch.from_numpy(data.obs[~is_val]).to(device)
    act_t = torch.from_numpy(data.actions[~is_val]).to(device)
    val_obs = torch.from_numpy(data.obs[is_val]).to(device)
    val_act = torch.from_numpy(data.actions[is_val]).to(device)
    curve: list[tuple[float, float]] = []

    with ctx.lineage.stage_run(ctx.experiment, "train", ctx.pipeline_run_id, {}) as run:
        run.log_params({**cfg.model_dump(), "device": device, "train_transitions": len(obs_t),
                        "val_transitions": len(val_obs)})
        run.log_dataset(dataset, context="training")
        start = time.perf_counter()
        with ctx.progress.bar("train", cfg.epochs) as bar:
            for epoch in range(cfg.epochs):
                model.train()
                perm = torch.randperm(len(obs_t), device=device)
                total = 0.0
                for i in range(0, len(perm), cfg.batch_size):
                    idx = perm[i : i + cfg.batch_size]
                    loss = torch.nn.functional.mse_loss(model(obs_t[idx]), act_t[idx])
                    optim.zero_grad(set_to_none=True)
                    loss.backward()
                    optim.step()
                    total += float(loss.detach()) * len(idx)
                sched.step()
                model.eval()
                with torch.inference_mode():
                    val = float(torch.nn.functional.mse_loss(model(val_obs), val_act))
                curve.append((total / len(obs_t), val))
                run.log_metrics({"train_loss": curve[-1][0], "val_loss": val}, step=epoch)
                crash_point("train.epoch")
                bar.advance(1, loss=f"{curve[-1][0]:.4f}", val=f"{val:.4f}")
        run.log_metrics({"train_seconds": time.perf_counter() - start})
        run.log_figure(_learning_curve(curve), "learning_curve.png")
        model = model.cpu().eval()
        path = ctx.scratch / f"policy-{run.run_id}.npz"
        meta = {"obs_dim": spec.obs_dim, "act_dim": spec.act_dim, "hidden": list(cfg.hidden),
                "task": spec.name}
        save_policy(model, path, meta)
        policy = ctx.publish(
            path, Policy, "train", STAGE_VERSION, (dataset.digest,), run.run_id,
            task=spec.name,
            obs_dim=spec.obs_dim,
            act_dim=spec.act_dim,
            hidden=cfg.hidden,
            train_loss=curve[-1][0],
            val_loss=curve[-1][1],
        )
        run.set_tags({"physai.policy.digest": policy.digest,
                      "physai.dataset.digest": dataset.digest})
    log.info("trained policy: train loss %.5f, val loss %.5f", *curve[-1])
    return policy


def _learning_curve(curve: list[tuple[float, float]]) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.add_subplot()
    epochs = np.arange(1, len(curve) + 1)
    ax.plot(epochs, [c[0] for c in curve], label="train")
    ax.plot(epochs, [c[1] for c in curve], label="validation")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("action MSE")
    ax.set_title("behaviour cloning")
    ax.legend()
    fig.tight_layout()
    return fig


def train_stage(
    cfg: TrainConfig, ctx: StageContext, stage: str, dataset: Dataset | None
) -> Policy:
    """The ``bc`` algorithm's entry in :mod:`stages.algorithms`: clone ``dataset``."""
    if dataset is None:
        raise KeyError(f"pipeline {ctx.pipeline.config.name}: behaviour cloning needs a dataset")
    return train(cfg, dataset, ctx)
