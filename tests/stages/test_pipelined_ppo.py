"""Pipelined PPO: the next rollout collected beside the update, with the parameters of one
update ago, as reproducible as a sequential run, and reachable from a config."""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path
from typing import Any

import torch
from mlflow import MlflowClient

from stages.artifacts.records import Policy
from stages.orchestration.context import NullProgress
from stages.pipeline.config import ResolvedPipeline, load_pipeline
from stages.pipeline.session import stage_context, start_pipeline, training_context
from stages.sections.models import PPOConfig
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.locomotion import LocomotionEnv
from stages.training import ppo
from stages.training.context import TrainingContext
from stages.training.pipelined_ppo import PipelinedPPO
from stages.training.rl_env import RslRlEnv
from tests.stages.test_ppo import ppo_config

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "sim_scenes" / "locomotion" / "train.yaml"
STEPS = 6

def _train_context(pipeline: ResolvedPipeline) -> TrainingContext:
    """The context the pipeline gives its PPO train stage, in a new pipeline run."""
    return training_context(pipeline, stage_context(pipeline, start_pipeline(pipeline),
                                                    NullProgress()), "train")



def pipelined(seed: int = 0) -> tuple[Any, PipelinedPPO]:
    """A learner and its pipeline over 16 worlds of the locomotion training scene."""
    from rsl_rl.algorithms import PPO

    cfg = PPOConfig(scene=str(TRAIN), iterations=10, num_worlds=16, steps_per_iteration=STEPS,
                    hidden=(16, 16), pipelined=True, final_noise_std=0.1)
    torch.manual_seed(seed)
    venv = RslRlEnv(LocomotionEnv(load_scene(TRAIN), 16, seed), "cpu")
    rsl_cfg = ppo.rsl_rl_config(cfg, ppo.DistInfo(0, 0, 1, "cpu"))
    with contextlib.redirect_stdout(io.StringIO()):
        alg = PPO.construct_algorithm(venv.get_observations(), venv, rsl_cfg, "cpu")
    alg.train_mode()
    return alg, PipelinedPPO(alg, venv, rsl_cfg, "cpu", seed)


def log_probs(actor: Any, storage: Any) -> torch.Tensor:
    """The log-probability under ``actor`` of every stored action of ``storage``."""
    with torch.inference_mode():
        actor(storage.observations.flatten(0, 1), stochastic_output=True)
        return actor.get_output_log_prob(storage.actions.flatten(0, 1)).flatten()


def test_the_next_rollout_is_collected_with_the_parameters_before_the_update() -> None:
    alg, pipe = pipelined()
    obs = pipe.venv.get_observations()
    before = copy.deepcopy(alg.actor)
    obs, losses, collect_s, learn_s = pipe.iteration(obs, STEPS, 0, collect_next=True)
    assert set(losses) >= {"value", "surrogate", "entropy"}
    assert collect_s > 0 and learn_s > 0
    after = alg.actor
    stored = pipe.collector.storage
    assert stored.step == STEPS  # the next iteration's rollout is waiting, full
    recorded = stored.actions_log_prob.flatten()
    # collected by the parameters the update started from, not by those it produced
    assert torch.allclose(log_probs(before, stored), recorded, atol=1e-5)
    assert not torch.allclose(log_probs(after, stored), recorded, atol=1e-3)
    # ...and from now on the collector holds the updated parameters
    for name, value in alg.actor.state_dict().items():
        assert torch.equal(pipe.collector.actor.state_dict()[name], value), name
    # the next iteration updates on that rollout, and collects nothing after the last
    pipe.iteration(obs, STEPS, 1, collect_next=False)
    assert pipe.collector.storage.step == 0


def test_the_update_measures_the_old_rollout_from_its_own_parameters() -> None:
    alg, pipe = pipelined()
    obs, *_ = pipe.iteration(pipe.venv.get_observations(), STEPS, 0, collect_next=True)
    rollout = pipe.collector.storage  # collected with the parameters before update 0
    stale = rollout.actions_log_prob.flatten().clone()
    stale_values = rollout.values.clone()
    alg.storage, pipe.collector.storage = rollout, alg.storage
    pipe.refresh(obs)  # what update 1 does first, with obs the observation after the rollout
    fresh = rollout.actions_log_prob.flatten()
    assert torch.allclose(fresh, log_probs(alg.actor, rollout), atol=1e-5)
    assert not torch.allclose(fresh, stale, atol=1e-3)
    with torch.no_grad():
        values = alg.critic(rollout.observations.flatten(0, 1))
    assert torch.allclose(rollout.values.flatten(), values.flatten(), atol=1e-6)
    assert not torch.allclose(rollout.values, stale_values, atol=1e-4)
    with torch.no_grad():  # the returns: GAE from the fresh values, bootstrapped at obs
        following = alg.critic(obs)
    advantage, returns = torch.zeros_like(following), torch.zeros_like(rollout.returns)
    for step in reversed(range(STEPS)):
        live = 1.0 - rollout.dones[step].float()
        delta = rollout.rewards[step] + live * alg.gamma * following - rollout.values[step]
        advantage = delta + live * alg.gamma * alg.lam * advantage
        returns[step] = advantage + rollout.values[step]
        following = rollout.values[step]
    assert torch.allclose(rollout.returns, returns, atol=1e-5)


def test_a_pipelined_run_is_reproducible() -> None:
    runs = []
    for _ in range(2):
        alg, pipe = pipelined(seed=3)
        obs = pipe.venv.get_observations()
        for it in range(3):
            obs, *_ = pipe.iteration(obs, STEPS, it, collect_next=True)
        runs.append(alg.actor.state_dict())
    for name, value in runs[0].items():
        assert torch.equal(runs[1][name], value), name


def test_the_collector_is_capped_for_the_iteration_its_rollout_is_for() -> None:
    _, pipe = pipelined()
    seen: list[int] = []
    obs = pipe.venv.get_observations()
    obs, *_ = pipe.iteration(obs, STEPS, 4, collect_next=True,
                             cap=lambda a, i: seen.append(i))
    pipe.iteration(obs, STEPS, 5, collect_next=True, cap=lambda a, i: seen.append(i))
    assert seen == [4, 6, 7]  # first rollout for 4; then beside update 5 for 6, beside 6 for 7


def test_the_train_stage_trains_pipelined_from_the_config(
    physai_home: Path, tmp_path: Path
) -> None:
    pipeline = load_pipeline(ppo_config(tmp_path, iterations=3, pipelined=True))
    cfg = pipeline.config.train
    assert isinstance(cfg, PPOConfig) and cfg.pipelined
    (tmp_path / "sequential").mkdir()
    sequential = load_pipeline(ppo_config(tmp_path / "sequential", iterations=3))
    assert pipeline.stage_digest("train") != sequential.stage_digest("train")
    ctx = _train_context(pipeline)
    policy = ppo.train_ppo(cfg, ctx, stage="train")
    assert isinstance(policy, Policy) and policy.algorithm == "ppo"
    uri = f"sqlite:///{physai_home / 'mlflow.db'}"
    run = MlflowClient(uri, registry_uri=uri).get_run(policy.mlflow_run_id)
    assert run.data.params["pipelined"] == "True"
    history = MlflowClient(uri, registry_uri=uri).get_metric_history(
        policy.mlflow_run_id, "steps_per_second")
    assert sorted(m.step for m in history) == [0, 1, 2]
