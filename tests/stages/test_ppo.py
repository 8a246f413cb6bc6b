"""PPO through rsl_rl: the environment adapter, the policy conversion, checkpoints and resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from stages.artifacts.records import Checkpoint, Policy
from stages.orchestration.context import NullProgress
from stages.pipeline.config import ResolvedPipeline, load_pipeline
from stages.pipeline.session import stage_context, start_pipeline, training_context
from stages.policies.local import load_policy, policy_fn
from stages.sections.models import PPOConfig
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.locomotion import LocomotionEnv
from stages.training import ppo
from stages.training.context import TrainingContext
from stages.training.rl_env import RslRlEnv

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
FLAT = ROOT / "sim_scenes" / "locomotion" / "flat.yaml"

def _train_context(pipeline: ResolvedPipeline) -> TrainingContext:
    """The context the pipeline gives its PPO train stage, in a new pipeline run."""
    return training_context(pipeline, stage_context(pipeline, start_pipeline(pipeline),
                                                    NullProgress()), "train")



def ppo_config(tmp_path: Path, **train: Any) -> Path:
    """The tiny PPO pipeline with ``train`` overrides, written next to the test."""
    data = yaml.safe_load((FIXTURES / "ppo_tiny.yaml").read_text())
    data["train"].update(scene=str(ROOT / "sim_scenes" / "locomotion" / "train.yaml"), **train)
    data["validate"]["suite"] = str(FIXTURES / "locomotion_suite_tiny.yaml")
    path = tmp_path / "ppo.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_adapter_restarts_fallen_worlds_and_marks_time_outs() -> None:
    env = LocomotionEnv(load_scene(FLAT), 6, 0)
    venv = RslRlEnv(env)
    flail = torch.zeros(6, env.act_dim)
    flail[:3] = torch.tensor(np.tile([1.0, -1.0, 1.0], 4), dtype=torch.float32)
    fell_once = np.zeros(6, dtype=bool)
    for t in range(env.episode_steps):
        obs, rewards, dones, extras = venv.step(flail)
        assert obs["policy"].shape == (6, env.obs_dim) and rewards.shape == (6,)
        time_outs = extras["time_outs"].numpy()
        if t < env.episode_steps - 1:
            assert not time_outs.any()
            fell_once |= dones.numpy()
            assert not env.fallen().any()  # every fallen robot was put back at once
        else:
            assert dones.all()
    assert fell_once[:3].all() and not fell_once[3:].any()
    returns, lengths, falls, successes = venv.pop_episode_stats()
    assert sum(falls) >= 3 and len(successes) > 0
    assert all(n <= env.episode_steps for n in lengths) and len(returns) == len(lengths)
    assert venv.pop_episode_stats() == ([], [], [], [])


def test_adapter_hands_the_learner_tensors_on_its_device() -> None:
    """What rsl_rl's process_env_step adds together lies on the learner's device (a GPU's,
    with the worlds on the CPU): checked on torch's meta device, which no CPU tensor matches."""
    env = LocomotionEnv(load_scene(FLAT), 3, 0)
    venv = RslRlEnv(env, "meta")
    obs, rewards, dones, extras = venv.step(torch.zeros(3, env.act_dim))
    tensors = [obs["policy"], rewards, dones, extras["time_outs"], venv.episode_length_buf,
               venv.get_observations()["policy"]]
    assert [t.device.type for t in tensors] == ["meta"] * len(tensors)


def test_policy_conversion_matches_the_rsl_rl_actor(tmp_path: Path) -> None:
    from rsl_rl.algorithms import PPO

    cfg = PPOConfig(scene="x", iterations=1, num_worlds=8, hidden=(16, 8))
    env = LocomotionEnv(load_scene(FLAT), 8, 0)
    venv = RslRlEnv(env)
    alg = PPO.construct_algorithm(venv.get_observations(), venv,
                                  ppo.rsl_rl_config(cfg, ppo.DistInfo(0, 0, 1, "cpu")), "cpu")
    obs = torch.randn(256, env.obs_dim) * 3
    alg.actor.obs_normalizer.train()
    alg.actor.update_normalization({"policy": obs})  # a non-trivial normalizer
    alg.actor.eval()
    with torch.no_grad():
        alg.actor.mlp[-1].weight.mul_(20.0)  # outputs beyond [-1, 1], to see the clipping
    expected = alg.actor({"policy": obs}).clamp(-1, 1).detach().numpy()
    module = ppo.actor_to_policy(alg, env.obs_dim, env.act_dim, cfg.hidden)
    from stages.policies.local import save_policy

    save_policy(module, tmp_path / "p.npz", {"obs_dim": env.obs_dim, "act_dim": env.act_dim,
                                             "hidden": [16, 8], "output": "clip"})
    loaded, _ = load_policy(tmp_path / "p.npz")
    got = policy_fn(loaded)(obs.numpy())
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert np.abs(expected).max() <= 1.0 and (np.abs(expected) == 1.0).any()


def test_ppo_stage_checkpoints_and_resumes_after_a_crash(
    physai_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    pipeline = load_pipeline(ppo_config(tmp_path, iterations=5, checkpoint_every=2))
    cfg = pipeline.config.train
    assert isinstance(cfg, PPOConfig)

    class Crash(Exception):
        pass

    steps = {"n": 0}
    real_step = RslRlEnv.step

    def crashing_step(self: RslRlEnv, actions: torch.Tensor) -> Any:
        steps["n"] += 1
        if steps["n"] > 3 * cfg.steps_per_iteration:  # dies in iteration 4, after checkpoint 2
            raise Crash
        return real_step(self, actions)

    monkeypatch.setattr(RslRlEnv, "step", crashing_step)
    first = _train_context(pipeline)
    with pytest.raises(Crash):
        ppo.train_ppo(cfg, first, stage="train")
    checkpoint = ppo.latest_checkpoint("train", first)
    assert isinstance(checkpoint, Checkpoint) and checkpoint.iteration == 2
    state = torch.load(first.store.open_payload(checkpoint), weights_only=True)
    assert {"actor_state_dict", "critic_state_dict", "optimizer_state_dict"} <= state.keys()

    monkeypatch.setattr(RslRlEnv, "step", real_step)
    second = _train_context(pipeline)
    policy = ppo.train_ppo(cfg, second, stage="train")
    assert isinstance(policy, Policy) and policy.algorithm == "ppo"
    assert len(policy.attempts) == 2 and policy.attempts[0] == checkpoint.mlflow_run_id
    assert policy.attempts[1] == policy.mlflow_run_id
    uri = f"sqlite:///{physai_home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    run = client.get_run(policy.mlflow_run_id)
    assert run.data.tags["physai.resumed_from.iteration"] == "2"
    assert run.data.tags["physai.resumed_from.checkpoint"] == checkpoint.digest
    history = client.get_metric_history(policy.mlflow_run_id, "steps_per_second")
    assert sorted(m.step for m in history) == [2, 3, 4]  # only the iterations after the resume
    assert client.get_run(checkpoint.mlflow_run_id).info.status == "FAILED"
    first_history = client.get_metric_history(checkpoint.mlflow_run_id, "steps_per_second")
    assert sorted(m.step for m in first_history) == [0, 1, 2]
    artifacts = {a.path for a in client.list_artifacts(policy.mlflow_run_id)}
    assert "learning_curve.png" in artifacts
    _, meta = load_policy(second.store.open_payload(policy))
    assert meta["output"] == "clip"


def test_changed_config_does_not_resume_an_old_checkpoint(
    physai_home: Path, tmp_path: Path
) -> None:
    first = load_pipeline(ppo_config(tmp_path, iterations=2, checkpoint_every=1))
    ctx = _train_context(first)
    ppo.train_ppo(first.config.train, ctx)  # type: ignore[arg-type]
    assert ppo.latest_checkpoint("train", ctx) is not None
    changed = load_pipeline(ppo_config(tmp_path, iterations=2, checkpoint_every=1, lr=5e-4))
    ctx2 = _train_context(changed)
    assert ppo.latest_checkpoint("train", ctx2) is None
    policy = ppo.train_ppo(changed.config.train, ctx2)  # type: ignore[arg-type]
    assert len(policy.attempts) == 1


def test_checkpoint_ref_to_a_foreign_artifact_is_refused(
    physai_home: Path, tmp_path: Path
) -> None:
    from physai_core.errors import IntegrityError

    pipeline = load_pipeline(ppo_config(tmp_path, iterations=2))
    ctx = _train_context(pipeline)
    policy = ppo.train_ppo(pipeline.config.train, ctx)  # type: ignore[arg-type]
    ctx.store.set_ref(ppo.checkpoint_ref("train", ctx), policy.digest)
    with pytest.raises(IntegrityError, match="not a checkpoint of this run"):
        ppo.latest_checkpoint("train", ctx)


def test_a_teacher_with_the_same_ppo_config_shares_the_cache_key(tmp_path: Path) -> None:
    from stages.pipeline.run import stage_key

    ppo_path = ppo_config(tmp_path, iterations=3)
    student = yaml.safe_load((FIXTURES / "student_tiny.yaml").read_text())
    student["teacher"] = yaml.safe_load(ppo_path.read_text())["train"]
    student["collect"]["scene"] = str(ROOT / "sim_scenes" / "locomotion" / "flat.yaml")
    student["validate"]["suite"] = str(FIXTURES / "locomotion_suite_tiny.yaml")
    student_path = tmp_path / "student.yaml"
    student_path.write_text(yaml.safe_dump(student))
    trained, taught = load_pipeline(ppo_path), load_pipeline(student_path)
    assert stage_key("train", trained, ()) == stage_key("teacher", taught, ())
    student["teacher"]["iterations"] = 4
    student_path.write_text(yaml.safe_dump(student))
    assert stage_key("train", trained, ()) != stage_key("teacher", load_pipeline(student_path), ())


def test_correlated_noise_keeps_its_marginal_and_is_slow_in_rollouts() -> None:
    from stages.training.rl_noise import CorrelatedGaussian

    torch.manual_seed(0)
    dist = CorrelatedGaussian(3, init_std=0.5, correlation=0.9)
    mean = torch.zeros(4000, 3)
    samples = []
    with torch.inference_mode():
        for _ in range(30):
            dist.update(mean)
            samples.append(dist.sample())
    x = torch.stack(samples).numpy()  # (time, worlds, actions)
    assert abs(x.std() - 0.5) < 0.02
    lag1 = np.corrcoef(x[1:].ravel(), x[:-1].ravel())[0, 1]
    assert 0.87 < lag1 < 0.93
    dist.update(mean)
    white = [dist.sample().numpy() for _ in range(2)]  # gradients on: rsl_rl's white noise
    assert abs(np.corrcoef(white[0].ravel(), white[1].ravel())[0, 1]) < 0.05
    with pytest.raises(ValueError, match="correlation"):
        CorrelatedGaussian(3, correlation=1.0)
