"""DAgger: the cloned policy drives, the expert labels, the labels join the data, and the
policy is trained again (Ross, Gordon and Bagnell, 2011).

Cloning alone drifts: a student that never saw its own mistakes has no label for the states they
lead to. Each round (``train.dagger``) rolls the last student out in the collect scene (a world
executes the expert's action instead with chance ``beta``, halved every round), records the
expert's label at every state the student visits, camera images included, and publishes the
round's episodes as a dataset whose parents are the previous dataset and the student. The next
student is trained from the last one's weights on every round's data so far. Every round's
dataset and policy are artifacts in the store with their lineage; the last policy is the train
stage's result.

The expert is the one that labelled the first dataset: the task's scripted expert, or a teacher
policy (its digest is the dataset's ``expert``) acting on the noise-free observation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from physai_core.errors import PhysaiError
from stages.artifacts.records import Dataset, Policy
from stages.datasets.demonstrations import Episode, write_dataset
from stages.datasets.recording import (
    python_expert,
    record_episodes,
    scripted_expert,
    teacher_expert,
)
from stages.policies.local import load_actor
from stages.policies.python_code import untrusted
from stages.sim.env.observation import with_images

if TYPE_CHECKING:
    from stages.sections.models import DaggerConfig, TrainConfig
    from stages.sim.env.batched import BatchedEnv
    from stages.sim.scenes.scene import Scene
    from stages.sim.tasks.catalog import TaskSpec
    from stages.training.context import TrainingContext

log = logging.getLogger(__name__)

STAGE = "train"
"""The stage that makes every round's dataset: the rounds run inside the train stage."""

STAGE_VERSION = "dagger-1"
"""The producer version recorded on every round's dataset (what tells a DAgger round's dataset
from one the collect stage recorded); bump when what a round records changes."""

RUN_NAME = "dagger"
"""The MLflow child run of each round's recording."""

MAX_ROUNDS = 20
"""Most DAgger rounds one train stage runs."""


@dataclass(frozen=True)
class Round:
    """One round's recording: its episodes and how the student alone did."""

    episodes: list[Episode]
    student_success: float
    """Success rate of the worlds the student drove alone (no expert action executed)."""


def expert_of(dataset: Dataset, ctx: TrainingContext) -> Callable[[BatchedEnv], np.ndarray]:
    """The expert that labelled ``dataset``: the scripted one, Python code (admitted by the
    pipeline's ``collect.trust_code``), or its teacher policy."""
    if dataset.expert == "scripted":
        return scripted_expert
    if dataset.expert.startswith("python:"):
        collect_cfg = ctx.collect
        if collect_cfg is None or not collect_cfg.trust_code:
            raise untrusted(ctx.config_path, "collect.trust_code", dataset.expert,
                            "trust_code: true")
        return python_expert(dataset.expert, ctx.task.action_range(), ctx.config_path,
                             "collect.expert")
    if dataset.expert.startswith("import:"):
        raise PhysaiError(f"train.dagger: dataset {dataset.digest} was imported "
                          f"({dataset.expert}); DAgger needs an expert to label new states")
    teacher = ctx.store.get(dataset.expert)
    if not isinstance(teacher, Policy):
        raise PhysaiError(f"train.dagger: the expert {dataset.expert} of dataset "
                          f"{dataset.digest} is a {teacher.kind}, not a policy")
    return teacher_expert(teacher, ctx)


def record_round(env: BatchedEnv, student: Callable[..., np.ndarray],
                 expert: Callable[[BatchedEnv], np.ndarray], beta: float,
                 rng: np.random.Generator, seed: int) -> Round:
    """One episode per world of ``env``: the student acts (a world executes the expert's
    action instead with chance ``beta``, drawn once per world), the expert's label is recorded.

    Shapes: each episode's obs (T, obs_dim), actions (T, act_dim), images (T, H, W, 3).
    """
    guided = rng.random(env.num_worlds) < beta

    def mixed(obs: np.ndarray, images: dict[str, np.ndarray], label: np.ndarray) -> np.ndarray:
        chosen = np.asarray(student(with_images(obs, images, student)), np.float32)
        return np.where(guided[:, None], label, chosen)

    episodes = record_episodes(env, expert, mixed, seed)
    alone = np.array([e.success for e in episodes])[~guided]
    return Round(episodes, float(alone.mean()) if alone.size else float("nan"))


def record_rounds(cfg: DaggerConfig, spec: TaskSpec, scene: Scene, num_worlds: int,
                  student: Callable[..., np.ndarray], expert: Callable[[BatchedEnv], np.ndarray],
                  round_index: int, seed: int) -> Round:
    """``cfg.episodes`` episodes of round ``round_index`` (1-based), ``num_worlds`` worlds at a
    time, in ``scene``."""
    beta = cfg.beta * 0.5 ** (round_index - 1)
    rng = np.random.default_rng([seed, round_index])
    episodes: list[Episode] = []
    alone: list[float] = []
    while len(episodes) < cfg.episodes:
        worlds = min(num_worlds, cfg.episodes - len(episodes))
        env_seed = seed * 1_000 + round_index * 100 + len(episodes)
        env = spec.make_env(scene, worlds, env_seed)
        try:
            recorded = record_round(env, student, expert, beta, rng, env_seed)
        finally:
            env.close()
        episodes += recorded.episodes
        if not np.isnan(recorded.student_success):
            alone.append(recorded.student_success)
    return Round(episodes, float(np.mean(alone)) if alone else float("nan"))


Retrain = Callable[..., Policy]
"""Trains a policy further: ``retrain(cfg, dataset, ctx, start=policy, epochs=n)``
(:func:`stages.steps.train.train`)."""


def dagger(cfg: TrainConfig, dataset: Dataset, policy: Policy, ctx: TrainingContext,
           retrain: Retrain) -> Policy:
    """``cfg.dagger.rounds`` rounds of DAgger after ``policy`` was cloned from ``dataset``,
    each student trained by ``retrain``; the last round's policy (module doc)."""
    rounds = cfg.dagger
    collect_cfg = ctx.collect
    scene = ctx.collect_scene
    if rounds is None:
        return policy
    if collect_cfg is None or scene is None:
        raise PhysaiError(f"pipeline {ctx.experiment}: train.dagger needs a collect "
                          "scene to roll the student out in")
    if rounds.rounds > MAX_ROUNDS:
        raise PhysaiError(f"train.dagger.rounds is {rounds.rounds}; at most {MAX_ROUNDS}")
    spec = ctx.task
    expert = expert_of(dataset, ctx)
    data, student = dataset, policy
    for r in range(1, rounds.rounds + 1):
        act = load_actor(ctx.store.open_payload(student))
        with ctx.lineage.stage_run(ctx.experiment, RUN_NAME, ctx.pipeline_run_id, {}) as run:
            run.log_params({"round": r, "episodes": rounds.episodes, "student": student.digest,
                            "beta": rounds.beta * 0.5 ** (r - 1)})
            recorded = record_rounds(rounds, spec, scene, collect_cfg.num_worlds, act, expert,
                                     r, ctx.seed)
            data = publish_round(ctx, spec, recorded, data, student, r, run.run_id)
            run.log_metrics({"student_success": recorded.student_success,
                             "transitions": data.transitions})
            run.log_dataset(data, context="dagger")
        log.info("DAgger round %d: the student succeeds alone in %.2f of its worlds; %d "
                 "episodes in all", r, recorded.student_success, data.episodes)
        student = retrain(cfg, data, ctx, start=student,
                        epochs=rounds.epochs if rounds.epochs is not None else cfg.epochs)
    return student


def publish_round(ctx: TrainingContext, spec: TaskSpec, recorded: Round, previous: Dataset,
                  student: Policy, round_index: int, run_id: str | None) -> Dataset:
    """Write and publish round ``round_index``'s dataset: the previous dataset's episodes
    (copied as stored) and this round's; its parents are the previous dataset and the student
    that drove."""
    scene, digest = ctx.collect_scene, ctx.collect_scene_digest
    if scene is None or digest is None:
        raise PhysaiError(f"pipeline {ctx.experiment}: train.dagger needs a collect "
                          "scene to roll the student out in")
    path = ctx.scratch / f"dagger-{ctx.pipeline_run_id}-{round_index}.hdf5"
    transitions = write_dataset(
        path, recorded.episodes, task=spec.name, obs_names=spec.obs_names,
        action_names=spec.action_names,
        env_args={"scene": scene.config.model_dump(mode="json", by_alias=True),
                  "backend": "mujoco", "expert": previous.expert, "dagger_round": round_index,
                  "student": student.digest},
        first=ctx.store.open_payload(previous))
    return ctx.publish(
        path, Dataset, STAGE, STAGE_VERSION, (previous.digest, student.digest), run_id,
        task=spec.name, episodes=previous.episodes + len(recorded.episodes),
        transitions=transitions,
        obs_names=spec.obs_names, action_names=spec.action_names,
        scene_digest=digest,
        expert_success_rate=float(np.mean([e.success for e in recorded.episodes])),
        expert=previous.expert)
