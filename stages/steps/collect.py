"""The collect stage: record demonstrations with the task's scripted expert or a teacher policy,
or import them from a dataset in a registered format (``collect.source``).

A teacher (a PPO policy from this pipeline, the registry or the store) acts on the noise-free
observation, as a privileged teacher does, while the dataset records the noisy observation the
student will see on the robot.

Before recording, the expert acts alone for :data:`EXPERT_CHECK_EPISODES` episodes of the
collect scene, with no exploration noise; its success rate there is logged and recorded as
``expert_clean_success``, and a scripted expert below ``collect.min_expert_success`` stops
collect with one line naming the fields that tune it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from physai_core.errors import ConfigError, PhysaiError
from stages.artifacts.records import Dataset, Policy
from stages.core.crash import crash_point
from stages.datasets.demonstrations import Episode, write_dataset
from stages.datasets.recording import (
    Expert,
    python_expert,
    record_episodes,
    scripted_expert,
    start_episode,
    teacher_expert,
)
from stages.orchestration.context import StageContext
from stages.policies.python_code import untrusted
from stages.sections.models import CollectConfig, expert_kind
from stages.sim.env.batched import BatchedEnv
from stages.sim.tasks.catalog import TaskSpec

if TYPE_CHECKING:
    from stages.sim.scenes.scene import Scene

log = logging.getLogger(__name__)

STAGE_VERSION = "1"

EXPERT_CHECK_EPISODES = 20
"""Noise-free episodes of the collect scene the expert's success is measured on before
recording: one batch of worlds, enough to tell an expert that reaches from one that does not."""


def _record(cfg: CollectConfig, spec: TaskSpec, scene: Scene, expert: Expert,
            ctx: StageContext, wanted: int) -> list[Episode]:
    """``wanted`` episodes of the expert in rounds of ``cfg.num_worlds`` worlds, each round
    seeded by its index, with a progress bar; each episode keeps its instruction, where the
    scene gives one (:func:`~stages.sim.scenes.scene.episode_instructions` of the round's
    seed)."""
    from stages.sim.scenes.scene import episode_instructions

    rng = np.random.default_rng(ctx.seed)
    episodes: list[Episode] = []
    with ctx.progress.bar("collect", wanted) as bar:
        round_index = 0
        while len(episodes) < wanted:
            n = min(cfg.num_worlds, wanted - len(episodes))
            seed = ctx.seed * 100_003 + round_index
            env = spec.make_env(scene, n, seed)
            episodes += _record_round(env, expert, cfg, rng, seed,
                                      episode_instructions(scene.config, n, seed))
            round_index += 1
            crash_point("collect.batch")
            bar.advance(n, noisy_expert_success=f"{np.mean([e.success for e in episodes]):.2f}")
    return episodes


def collect(cfg: CollectConfig, ctx: StageContext, *, task: TaskSpec, scene: Scene | None,
            scene_digest: str | None, source_digest: str | None = None,
            teacher: Policy | None = None) -> Dataset:
    """Roll out the expert in ``cfg.num_worlds`` worlds at a time in ``scene`` of ``task`` and
    record every episode.

    Executed actions carry Gaussian noise (``exploration_noise``) so the data covers states off
    the expert's path; the recorded action is always the expert's clean label. ``teacher``
    replaces the scripted expert when ``cfg.expert`` is not ``scripted``. A config with a
    ``source`` imports it instead (:func:`import_source`; ``source_digest`` is the digest the
    source had when the config was loaded).
    """
    if cfg.source is not None:
        return import_source(cfg, ctx, task=task.name, source_digest=source_digest)
    spec = task
    wanted = cfg.episodes
    if scene is None or scene_digest is None or wanted is None:
        raise PhysaiError(f"pipeline {ctx.experiment} has no collect stage")
    kind = expert_kind(cfg.expert)
    if (kind in ("scripted", "python")) != (teacher is None):
        raise PhysaiError(f"collect.expert is {cfg.expert!r} but the teacher passed is "
                          f"{teacher.digest if teacher else None}")
    expert: Expert = scripted_expert
    expert_name = "scripted"
    if teacher is not None:
        expert, expert_name = teacher_expert(teacher, ctx), teacher.digest
    elif kind == "python":
        if not cfg.trust_code:
            raise untrusted(ctx.config_path, "collect.trust_code", cfg.expert, "trust_code: true")
        expert = python_expert(cfg.expert, spec.action_range(), ctx.config_path,
                               "collect.expert")
        expert_name = cfg.expert
    with ctx.lineage.stage_run(ctx.experiment, "collect", ctx.pipeline_run_id, {}) as run:
        recording = cfg.model_dump(exclude={"source", "format", "obs_keys", "action_units"})
        run.log_params({"task": spec.name, "scene": scene.config.name, **recording,
                        "expert_digest": expert_name})
        clean = clean_success(spec, scene, expert, ctx.seed * 100_003)
        run.log_metrics({"expert_clean_success": clean})
        log.info("expert %s succeeds in %.2f of %d noise-free episodes of %s", expert_name,
                 clean, EXPERT_CHECK_EPISODES, cfg.scene)
        if teacher is None and clean < cfg.min_expert_success:
            raise weak_expert(spec.name, ctx.config_path, cfg, clean)
        episodes = _record(cfg, spec, scene, expert, ctx, wanted)
        rate = float(np.mean([e.success for e in episodes]))
        path = ctx.scratch / f"demos-{ctx.pipeline_run_id}.hdf5"
        transitions = write_dataset(
            path,
            episodes,
            task=spec.name,
            obs_names=spec.obs_names,
            action_names=spec.action_names,
            env_args={"scene": scene.config.model_dump(mode="json", by_alias=True),
                      "backend": "mujoco",
                      "expert": expert_name},
        )
        run.log_metrics({"expert_success_rate": rate, "transitions": transitions})
        dataset = ctx.publish(
            path, Dataset, "collect", STAGE_VERSION,
            (teacher.digest,) if teacher is not None else (), run.run_id,
            task=spec.name,
            episodes=len(episodes),
            transitions=transitions,
            obs_names=spec.obs_names,
            action_names=spec.action_names,
            scene_digest=scene_digest,
            expert_success_rate=rate,
            expert=expert_name,
        )
        run.log_dataset(dataset, context="collected")
        run.set_tags({"physai.dataset.digest": dataset.digest,
                      "physai.expert": expert_name})
    log.info("collected %d episodes (%d transitions), expert success %.3f",
             dataset.episodes, transitions, rate)
    return dataset


def clean_success(spec: TaskSpec, scene: Scene, expert: Expert, seed: int) -> float:
    """Success rate of ``expert`` acting alone, without exploration noise, in
    :data:`EXPERT_CHECK_EPISODES` episodes of ``scene`` (one batch of worlds seeded ``seed``)."""
    env = spec.make_env(scene, EXPERT_CHECK_EPISODES, seed)
    try:
        env.reset()
        start_episode(expert, env)
        for _ in range(env.episode_steps):
            env.step(expert(env))
        return float(np.mean(env.success()))
    finally:
        env.close()


def weak_expert(task: str, pipeline_file: Path, cfg: CollectConfig, rate: float) -> ConfigError:
    """The error that stops collect when the scripted expert of ``task`` succeeds in only
    ``rate`` of its noise-free episodes: it names the task file's expert fields for a task made
    from a task file, else the floor, ``collect.min_expert_success``."""
    from stages.sim.tasks.template import (
        registered_template,  # MuJoCo, as stages.pipeline.config loads it
    )

    who = cfg.expert if cfg.expert.startswith("python:") else f"the scripted expert of {task}"
    found = (f"{who} succeeds in {rate:.2f} of "
             f"{EXPERT_CHECK_EPISODES} noise-free episodes of collect scene {cfg.scene}, below "
             f"collect.min_expert_success {cfg.min_expert_success:g}")
    template = registered_template(task)
    if template is None or cfg.expert != "scripted":
        return ConfigError.one(pipeline_file, "collect.min_expert_success",
                               cfg.min_expert_success,
                               f"{found}; the expert is code: fix it or lower the floor")
    gains = template.expert
    return ConfigError.one(template.task_file, "expert",
                           {"gain": round(gains.gain, 4), "damping": round(gains.damping, 4),
                            "null_gain": round(gains.null_gain, 4)},
                           f"{found} ({pipeline_file}); tune expert.gain, expert.damping and "
                           "expert.null_gain")


def import_source(cfg: CollectConfig, ctx: StageContext, *, task: str,
                  source_digest: str | None) -> Dataset:
    """The dataset ``collect.source`` names: a file or folder in ``collect.format``, checked
    against ``task`` and published, or a dataset already in the store. A source named through
    a symbolic link is refused, as ``flows dataset import`` refuses it; one whose bytes are no
    longer ``source_digest`` (the digest when the config was loaded) too."""
    from stages.core.resources import is_resource, resolve_file
    from stages.datasets import lerobot_format
    from stages.datasets.importer import convert, publish_converted

    config = ctx.config_path
    field = "collect.source"
    with ctx.lineage.stage_run(ctx.experiment, "collect", ctx.pipeline_run_id, {}) as run:
        if cfg.source_digest is not None:
            found = ctx.store.get(cfg.source_digest)
            if not isinstance(found, Dataset) or found.task != task:
                what = (f"a dataset for task {found.task}" if isinstance(found, Dataset)
                        else f"a {found.kind}")
                raise ConfigError.one(config, field, cfg.source,
                                      f"is {what}, not a dataset for task {task}")
            run.log_params({"source": cfg.source, "task": task})
            run.log_dataset(found, context="collected")
            run.set_tags({"physai.dataset.digest": found.digest, "physai.expert": found.expert})
            return found
        named = cfg.source or ""
        if not is_resource(named) and (config.parent / named).is_symlink():
            raise ConfigError.one(config, field, named,
                                  "is a symbolic link; name the file or folder it points to")
        source = resolve_file(named, config.parent)
        with lerobot_format.camera_keys(cfg.camera_keys):
            converted = convert(source, cfg.format or "", ctx.scratch, task, cfg.obs_keys,
                                cfg.action_units)
        if converted.source_digest != source_digest:
            converted.discard()
            raise ConfigError.one(config, field, cfg.source,
                                  f"changed since the config was loaded (sha256 "
                                  f"{source_digest} -> "
                                  f"{converted.source_digest})")
        dataset = publish_converted(converted, ctx.store, ctx.producer("collect", STAGE_VERSION),
                                    run)
        run.log_metrics({"transitions": dataset.transitions,
                         "source_success_rate": dataset.expert_success_rate})
    return dataset


def _record_round(
    env: BatchedEnv, expert: Expert, cfg: CollectConfig, rng: np.random.Generator, seed: int,
    instructions: Sequence[str] | None = None,
) -> list[Episode]:
    """Record one episode per world of ``env``: the expert's action with exploration noise
    executed, its clean label recorded, with each world's instruction."""

    def noisy(obs: np.ndarray, images: dict[str, np.ndarray], label: np.ndarray) -> np.ndarray:
        noise = rng.normal(0.0, cfg.exploration_noise, label.shape) if cfg.exploration_noise else 0
        return np.asarray(label + noise)

    return record_episodes(env, expert, noisy, seed, instructions)
