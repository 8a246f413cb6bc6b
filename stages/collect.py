"""The collect stage: record demonstrations with the task's scripted expert."""

from __future__ import annotations

import logging

import numpy as np

from stages.artifacts import Dataset
from stages.config import CollectConfig
from stages.context import StageContext
from stages.data import Episode, write_dataset
from stages.sim.batched import BatchedEnv
from stages.sim.tasks import get_task

log = logging.getLogger(__name__)

STAGE_VERSION = "1"


def collect(cfg: CollectConfig, ctx: StageContext) -> Dataset:
    """Roll out the expert in ``cfg.num_worlds`` worlds at a time and record every episode.

    Executed actions carry Gaussian noise (``exploration_noise``) so the data covers states off
    the expert's path; the recorded action is always the expert's clean label.
    """
    spec = get_task(ctx.pipeline.config.task)
    scene = ctx.pipeline.collect_scene
    rng = np.random.default_rng(ctx.seed)
    episodes: list[Episode] = []
    with ctx.lineage.stage_run(ctx.experiment, "collect", ctx.pipeline_run_id, {}) as run:
        run.log_params({"task": spec.name, "scene": scene.config.name, **cfg.model_dump()})
        with ctx.progress.bar("collect", cfg.episodes) as bar:
            round_index = 0
            while len(episodes) < cfg.episodes:
                n = min(cfg.num_worlds, cfg.episodes - len(episodes))
                seed = ctx.seed * 100_003 + round_index
                episodes += _record_round(spec.make_env(scene, n, seed), cfg, rng, seed)
                round_index += 1
                bar.advance(n, noisy_expert_success=f"{np.mean([e.success for e in episodes]):.2f}")
        rate = float(np.mean([e.success for e in episodes]))
        path = ctx.scratch / f"demos-{ctx.pipeline_run_id}.hdf5"
        transitions = write_dataset(
            path,
            episodes,
            task=spec.name,
            obs_names=spec.obs_names,
            action_names=spec.action_names,
            env_args={"scene": scene.config.model_dump(mode="json"), "backend": "mujoco"},
        )
        run.log_metrics({"expert_success_rate": rate, "transitions": transitions})
        dataset = ctx.store.publish(
            path,
            lambda digest, uri: Dataset(
                digest=digest,
                uri=uri,
                producer=ctx.producer("collect", STAGE_VERSION),
                parents=(),
                mlflow_run_id=run.run_id,
                task=spec.name,
                episodes=len(episodes),
                transitions=transitions,
                obs_names=spec.obs_names,
                action_names=spec.action_names,
                scene_digest=ctx.pipeline.collect_scene_digest,
                expert_success_rate=rate,
            ),
        )
        path.unlink()
        run.log_dataset(dataset, context="collected")
        run.set_tags({"physai.dataset.digest": dataset.digest})
    log.info("collected %d episodes (%d transitions), expert success %.3f",
             dataset.episodes, transitions, rate)
    return dataset


def _record_round(
    env: BatchedEnv, cfg: CollectConfig, rng: np.random.Generator, seed: int
) -> list[Episode]:
    """Record one episode per world of ``env``."""
    obs = env.reset()
    n, steps = env.num_worlds, env.episode_steps
    obs_buf = np.empty((steps, n, env.obs_dim), np.float32)
    act_buf = np.empty((steps, n, env.act_dim), np.float32)
    rew_buf = np.empty((steps, n), np.float32)
    done_buf = np.empty((steps, n), bool)
    for t in range(steps):
        label = env.expert_action()
        noise = rng.normal(0.0, cfg.exploration_noise, label.shape) if cfg.exploration_noise else 0
        obs_buf[t], act_buf[t] = obs, label
        obs, rew_buf[t], done_buf[t] = env.step(np.clip(label + noise, -1.0, 1.0))
    success = env.success()
    return [
        Episode(obs_buf[:, i], act_buf[:, i], rew_buf[:, i], done_buf[:, i], bool(success[i]),
                seed)
        for i in range(n)
    ]
