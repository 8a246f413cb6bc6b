"""The train stage: behaviour cloning in PyTorch with observation normalization.

A task that sees (declares cameras) clones a policy that reads its camera images beside the
state (:mod:`stages.policies.vision`): mini-batches index the dataset's uint8 frames (they are never
converted whole) and each training frame is shifted at random by up to ``train.image_shift``
pixels. :func:`train_more` and the ``start`` argument of :func:`train` continue training a
policy from its weights (DAgger's rounds). With ``train.chunk_size`` k above 1, the policy's
head predicts a chunk of the next k actions of the demonstration (the episode's last action
repeated past its end), (batch, k, act_dim), for a state or a seeing policy alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from physai_core.errors import PhysaiError
from stages.artifacts.records import Dataset, Policy
from stages.core.crash import crash_point
from stages.datasets.demonstrations import Transitions, read_transitions
from stages.orchestration.context import StageContext, resolve_device
from stages.policies.local import (
    build_policy,
    chunk_size_of,
    chunk_targets,
    load_policy,
    save_policy,
    with_chunks,
)
from stages.sections.models import TrainConfig
from stages.sim.env.observation import STATE_KEY
from stages.sim.tasks.catalog import TaskSpec, get_task
from stages.training.context import TrainingContext

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure
    from torch import nn

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
MIN_STD = 1e-3

VAL_CHUNK_BYTES = 64 * 2**20
"""Most bytes of float32 input one validation forward pass reads; larger splits go in chunks."""

EpochHook = Callable[[int, float, float], None]
"""Called after every epoch with its index, the mean training loss and the validation loss."""


def train(
    cfg: TrainConfig, dataset: Dataset, ctx: StageContext, *, start: Policy | None = None,
    epochs: int | None = None,
) -> Policy:
    """Fit a policy to the dataset's expert actions (MSE), holding out whole episodes for val
    loss: an MLP over the state, or for a task with cameras a policy that also sees them.

    ``start``: a policy of this task to continue from (its weights and normalizer; a DAgger
    round), which becomes a parent of the new one; None trains a new one. ``epochs``: passes
    over the training split, ``cfg.epochs`` when None. With ``cfg.chunk_size`` k above 1 the
    policy predicts the demonstration's next k actions at every step (:func:`chunked`).
    """
    import torch

    spec = get_task(dataset.task)
    data = read_transitions(ctx.store.open_payload(dataset), spec.obs_dim, spec.act_dim,
                            cameras=spec.cameras)
    device = resolve_device(cfg.device)
    torch.manual_seed(ctx.seed)
    rng = np.random.default_rng(ctx.seed)
    is_val = held_out(data.episode_index, cfg.val_fraction, rng)
    if start is None:
        model = new_policy(cfg, spec, data, is_val)
        meta = policy_meta(model, spec, cfg)
    else:
        if start.task != spec.name:
            raise PhysaiError(f"policy {start.digest[:12]} is for task {start.task}, the "
                              f"dataset for {spec.name}")
        model, meta = load_policy(ctx.store.open_payload(start))
    data = chunked(data, model)
    epochs = cfg.epochs if epochs is None else epochs
    parents = (dataset.digest,) if start is None else (dataset.digest, start.digest)

    with ctx.lineage.stage_run(ctx.experiment, "train", ctx.pipeline_run_id, {}) as run:
        # torch's sums, and so the policy's last bits, depend on its CPU threads.
        run.log_params({**cfg.model_dump(), "device": device, "epochs": epochs,
                        "torch_threads": torch.get_num_threads(),
                        "train_transitions": int((~is_val).sum()),
                        "val_transitions": int(is_val.sum()),
                        "inputs": ",".join(_inputs(model)),
                        **({"start_policy": start.digest} if start is not None else {})})
        run.log_dataset(dataset, context="training")
        began = time.perf_counter()
        with ctx.progress.bar("train", epochs) as bar:

            def logged(epoch: int, loss: float, val: float) -> None:
                run.log_metrics({"train_loss": loss, "val_loss": val}, step=epoch)
                crash_point("train.epoch")
                bar.advance(1, loss=f"{loss:.4f}", val=f"{val:.4f}")

            curve = fit(model.to(device), data, is_val, cfg, epochs, logged)
        run.log_metrics({"train_seconds": time.perf_counter() - began})
        run.log_figure(_learning_curve(curve), "learning_curve.png")
        model = model.cpu().eval()
        path = ctx.scratch / f"policy-{run.run_id}.npz"
        save_policy(model, path, meta)
        policy = ctx.publish(
            path, Policy, "train", STAGE_VERSION, parents, run.run_id,
            task=spec.name,
            obs_dim=spec.obs_dim,
            act_dim=spec.act_dim,
            hidden=tuple(meta["hidden"]),
            train_loss=curve[-1][0],
            val_loss=curve[-1][1],
        )
        run.set_tags({"physai.policy.digest": policy.digest,
                      "physai.dataset.digest": dataset.digest})
    log.info("trained policy: train loss %.5f, val loss %.5f", *curve[-1])
    return policy


def chunked(data: Transitions, module: nn.Module) -> Transitions:
    """``data`` as ``module`` is trained on: for a policy that emits chunks of k actions, each
    row's actions are the demonstration's next k (:func:`stages.policies.local.chunk_targets`),
    (N, k, act_dim); otherwise ``data`` itself."""
    size = chunk_size_of(module)
    if size is None:
        return data
    return replace(data, actions=chunk_targets(data.actions, data.episode_index, size))


def held_out(episode_index: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Which transitions belong to the validation split: ``fraction`` of the episodes (at least
    one), drawn with ``rng``. Shape: (N,) int -> (N,) bool."""
    n_episodes = int(episode_index.max()) + 1
    val_episodes = rng.choice(n_episodes, max(1, round(n_episodes * fraction)), False)
    return np.isin(episode_index, val_episodes)


def new_policy(cfg: TrainConfig, spec: TaskSpec, data: Transitions, is_val: np.ndarray
               ) -> nn.Module:
    """An untrained policy for ``spec`` normalizing the state with the training split's mean
    and std: the state MLP, or for a task with cameras one that sees each colour image."""
    mean = data.obs[~is_val].mean(axis=0)
    std = np.maximum(data.obs[~is_val].std(axis=0), MIN_STD)
    cameras = [(cam.image_key, cam.shape(cam.image_key)) for cam in spec.cameras if cam.rgb]
    if not cameras:
        return build_policy(spec.obs_dim, spec.act_dim, cfg.hidden, mean, std,
                            chunk_size=cfg.chunk_size)
    from stages.policies.vision import build_vision_policy

    k = cfg.chunk_size
    model = build_vision_policy(spec.obs_dim, spec.act_dim * k, cfg.hidden, cameras, mean, std,
                                cfg.encoder_channels)
    return model if k == 1 else with_chunks(model, k, spec.act_dim)


def policy_meta(model: nn.Module, spec: TaskSpec, cfg: TrainConfig) -> dict[str, Any]:
    """The npz metadata of ``model``, a policy :func:`new_policy` built for ``spec``; one that
    emits chunks of k actions has ``chunk_size`` k."""
    size = chunk_size_of(model)
    chunk = {"chunk_size": size} if size is not None else {}
    if _inputs(model) == (STATE_KEY,):
        return {"obs_dim": spec.obs_dim, "act_dim": spec.act_dim, "hidden": list(cfg.hidden),
                "task": spec.name, **chunk}
    from stages.policies.vision import VisionPolicy, vision_meta

    assert isinstance(model, VisionPolicy)
    return {**vision_meta(model), "task": spec.name, **chunk}


def train_more(
    module: nn.Module, data: Transitions, cfg: TrainConfig, epochs: int, *, seed: int = 0,
    device: str = "cpu", on_epoch: EpochHook | None = None,
) -> list[tuple[float, float]]:
    """Continue training ``module`` (a policy of :func:`new_policy` or
    :func:`stages.policies.local.load_policy`, its normalizer kept) on ``data`` for ``epochs``
    passes, as :func:`train` does: the same optimizer and cosine schedule, ``cfg.val_fraction`` of
    the episodes held out (drawn from ``seed``), and for a policy that sees, ``data.images`` read
    batch by batch and shifted by up to ``cfg.image_shift`` pixels.

    Returns the learning curve, (mean training loss, validation loss) per epoch; ``module`` is
    left on the CPU in eval mode. ``on_epoch`` is called after every epoch.
    """
    import torch

    torch.manual_seed(seed)
    is_val = held_out(data.episode_index, cfg.val_fraction, np.random.default_rng(seed))
    try:
        return fit(module.to(device), chunked(data, module), is_val, cfg, epochs, on_epoch)
    finally:
        module.cpu().eval()


def fit(
    module: nn.Module, data: Transitions, is_val: np.ndarray, cfg: TrainConfig, epochs: int,
    on_epoch: EpochHook | None = None,
) -> list[tuple[float, float]]:
    """Minimize the MSE of ``module``'s actions against ``data.actions`` on the rows not in
    ``is_val`` (AdamW, cosine schedule over ``epochs``, mini-batches of ``cfg.batch_size``),
    on the device ``module`` is on. Returns (mean training loss, validation loss) per epoch."""
    import torch

    device = next(module.parameters()).device
    train_split = _Split(module, data, ~is_val, device)
    val_split = _Split(module, data, is_val, device)
    optim = torch.optim.AdamW(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=epochs)
    curve: list[tuple[float, float]] = []
    for epoch in range(epochs):
        module.train()
        perm = torch.randperm(len(train_split), device=device)
        total = 0.0
        for i in range(0, len(perm), cfg.batch_size):
            idx = perm[i : i + cfg.batch_size]
            out = module(*train_split.inputs(idx, cfg.image_shift))
            loss = torch.nn.functional.mse_loss(out, train_split.actions[idx])
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            total += float(loss.detach()) * len(idx)
        sched.step()
        module.eval()
        curve.append((total / len(train_split), val_split.loss(module)))
        if on_epoch is not None:
            on_epoch(epoch, *curve[-1])
    return curve


class _Split:
    """The rows of a dataset one split holds, as a policy reads them: the state and actions on
    the policy's device, the camera frames left where they are (uint8, host memory) and
    gathered batch by batch."""

    def __init__(self, module: nn.Module, data: Transitions, rows: np.ndarray, device: Any
                 ) -> None:
        import torch

        self.obs = torch.from_numpy(data.obs[rows]).to(device)
        self.actions = torch.from_numpy(data.actions[rows]).to(device)
        self.device = device
        self.rows = torch.from_numpy(np.flatnonzero(rows))
        self.frames = [torch.from_numpy(data.images[key]) for key in _inputs(module)[1:]]

    def __len__(self) -> int:
        return len(self.obs)

    def inputs(self, idx: torch.Tensor, shift: int = 0) -> tuple[torch.Tensor, ...]:
        """The policy's inputs at the split's rows ``idx``, each frame shifted at random by up
        to ``shift`` pixels. Shapes: obs (B, obs_dim) float32, frames (B, H, W, 3) uint8."""
        if not self.frames:
            return (self.obs[idx],)
        from stages.policies.vision import random_shift

        rows = self.rows[idx.cpu()]
        return (self.obs[idx], *(random_shift(f[rows], shift).to(self.device)
                                 for f in self.frames))

    def loss(self, module: nn.Module) -> float:
        """``module``'s action MSE over the whole split, in chunks of at most
        :data:`VAL_CHUNK_BYTES` of input."""
        import torch

        row_bytes = 4 * (self.obs.shape[1] + sum(f[0].numel() for f in self.frames))
        step = max(1, VAL_CHUNK_BYTES // row_bytes)
        total = 0.0
        with torch.inference_mode():
            for i in range(0, len(self), step):
                idx = torch.arange(i, min(i + step, len(self)), device=self.device)
                mse = torch.nn.functional.mse_loss(module(*self.inputs(idx)), self.actions[idx])
                total += float(mse) * len(idx)
        return total / len(self)


def _inputs(module: nn.Module) -> tuple[str, ...]:
    """The named tensors ``module`` reads, the state first."""
    return tuple(getattr(module, "inputs", None) or (STATE_KEY,))


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
    cfg: TrainConfig, ctx: TrainingContext, stage: str, dataset: Dataset | None
) -> Policy:
    """The ``bc`` algorithm's entry in :mod:`stages.training.algorithms`: clone ``dataset``, then
    run ``train.dagger``'s rounds when it is set (:mod:`stages.training.dagger`)."""
    if dataset is None:
        raise KeyError(f"pipeline {ctx.experiment}: behaviour cloning needs a dataset")
    policy = train(cfg, dataset, ctx)
    if cfg.dagger is None:
        return policy
    from stages.training.dagger import dagger

    return dagger(cfg, dataset, policy, ctx, train)
