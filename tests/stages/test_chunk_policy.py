"""Policies that emit chunks of actions: the cloned head's targets, the npz round trip (state
and vision), the config's fields, and validation's rollout asking for chunks only when due."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from physai_core.errors import ConfigError
from stages.core.hashing import sha256_file
from stages.datasets.demonstrations import Transitions
from stages.evaluation.rollout import chunk_runner, chunk_spec, rollout
from stages.policies.local import (
    ChunkPolicy,
    ChunkRunner,
    SeeingPolicy,
    build_policy,
    chunk_targets,
    load_actor,
    load_policy,
    policy_fn,
    run_chunks,
    save_policy,
    stored_chunk_size,
    with_chunks,
)
from stages.policies.vision import build_vision_policy
from stages.sections.models import TrainConfig, ValidateConfig
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.catalog import get_task
from stages.steps.train import train_more

ROOT = Path(__file__).resolve().parents[2]
SCENE = ROOT / "sim_scenes" / "reach" / "nominal.yaml"
OBS_DIM, ACT_DIM, K = 4, 2, 3


def _state(k: int = K, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_policy(OBS_DIM, ACT_DIM, (16,), np.zeros(OBS_DIM, np.float32),
                        np.ones(OBS_DIM, np.float32), chunk_size=k)


def test_a_chunk_is_the_next_actions_of_its_episode_padded_with_its_last() -> None:
    actions = np.arange(10, dtype=np.float32).reshape(5, 2)
    episodes = np.array([0, 0, 0, 1, 1])
    got = chunk_targets(actions, episodes, 3)
    assert got.shape == (5, 3, 2)
    rows = [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 4], [4, 4, 4]]
    np.testing.assert_array_equal(got, actions[np.array(rows)])


def test_one_action_a_step_is_the_network_of_before(tmp_path: Path) -> None:
    one, again = _state(1), _state(1)
    assert not hasattr(one, "chunk_size")
    assert [type(m).__name__ for m in one.modules()][2:] == ["Linear", "ELU", "Linear", "Tanh"]
    save_policy(one, tmp_path / "a.npz", {"obs_dim": OBS_DIM, "act_dim": ACT_DIM,
                                          "hidden": [16]})
    save_policy(again, tmp_path / "b.npz", {"obs_dim": OBS_DIM, "act_dim": ACT_DIM,
                                            "hidden": [16]})
    assert sha256_file(tmp_path / "a.npz") == sha256_file(tmp_path / "b.npz")
    act = load_actor(tmp_path / "a.npz")
    assert getattr(act, "chunk_size", None) is None
    assert act(np.zeros((3, OBS_DIM), np.float32)).shape == (3, ACT_DIM)
    assert stored_chunk_size(tmp_path / "a.npz") is None


def test_a_state_chunk_policy_round_trips_through_npz(tmp_path: Path) -> None:
    module = _state()
    assert sorted(module.state_dict()) == sorted(_state(1).state_dict())  # same keys, wider head
    path = tmp_path / "p.npz"
    save_policy(module, path, {"obs_dim": OBS_DIM, "act_dim": ACT_DIM, "hidden": [16],
                               "chunk_size": K})
    loaded, meta = load_policy(path)
    assert meta["chunk_size"] == K and loaded.chunk_size == K
    act = load_actor(path)
    assert isinstance(act, ChunkPolicy) and act.chunk_size == K
    obs = np.random.default_rng(0).normal(size=(5, OBS_DIM)).astype(np.float32)
    out = act(obs)
    assert out.shape == (5, K, ACT_DIM) and out.dtype == np.float32
    np.testing.assert_array_equal(out, policy_fn(module)(obs))
    assert stored_chunk_size(path) == K


def test_a_vision_chunk_policy_round_trips_through_npz(tmp_path: Path) -> None:
    from stages.policies.vision import vision_meta

    torch.manual_seed(0)
    cameras = [("front_image", (16, 16, 3))]
    flat = build_vision_policy(OBS_DIM, ACT_DIM * K, (16,), cameras,
                               np.zeros(OBS_DIM, np.float32), np.ones(OBS_DIM, np.float32),
                               encoder_channels=(4, 4))
    module = with_chunks(flat, K, ACT_DIM)
    meta = {**vision_meta(flat), "chunk_size": K}
    assert meta["act_dim"] == ACT_DIM
    path = tmp_path / "v.npz"
    save_policy(module, path, meta)
    act = load_actor(path)
    assert isinstance(act, SeeingPolicy) and act.chunk_size == K
    rng = np.random.default_rng(1)
    seen = {"obs": rng.normal(size=(2, OBS_DIM)).astype(np.float32),
            "front_image": rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)}
    np.testing.assert_array_equal(act(seen), policy_fn(module)(seen))
    assert act(seen).shape == (2, K, ACT_DIM)


def test_cloning_a_chunk_fits_the_next_actions() -> None:
    rng = np.random.default_rng(0)
    steps, episodes = 10, 40
    t = np.tile(np.arange(steps), episodes) / steps
    gain = np.repeat(rng.uniform(-1, 1, episodes), steps)
    obs = np.stack([t, gain, gain * t, np.zeros_like(t)], axis=1).astype(np.float32)
    actions = np.stack([gain * t, -gain * t], axis=1).astype(np.float32)  # the future is known
    data = Transitions(obs, actions, np.repeat(np.arange(episodes), steps))
    module = _state()
    cfg = TrainConfig(epochs=150, batch_size=64, lr=1e-2, hidden=(16,), val_fraction=0.2,
                      chunk_size=K)
    curve = train_more(module, data, cfg, 150)
    assert curve[-1][1] < curve[0][1] / 10
    out = policy_fn(module)(obs[:steps])
    assert out.shape == (steps, K, ACT_DIM)
    wanted = chunk_targets(actions[:steps], np.zeros(steps), K)
    assert np.abs(out - wanted).max() < 0.1


def test_the_config_names_one_way_to_run_chunks() -> None:
    given = ValidateConfig(suite="s.yaml", min_success=0.5, chunk={"ensemble": 0.01}).chunk
    assert given is not None and given.how() == {"ensemble": 0.01}
    for bad in ({}, {"execute": 2, "ensemble": 0.1}, {"execute": 0}, {"ensemble": -1}):
        with pytest.raises(ValidationError, match="chunk"):
            ValidateConfig(suite="s.yaml", min_success=0.5, chunk=bad)
    with pytest.raises(ValidationError, match="chunk_size"):
        TrainConfig(epochs=1, chunk_size=4, dagger={"rounds": 1, "episodes": 2})
    assert TrainConfig(epochs=1).chunk_size == 1


def test_a_chunk_setting_for_a_policy_of_one_action_is_refused_in_one_line() -> None:
    act = policy_fn(_state(1))
    cfg = ValidateConfig(suite="s.yaml", min_success=0.5, chunk={"execute": 2})
    with pytest.raises(ConfigError, match=r"validate\.chunk") as caught:
        chunk_runner(act, cfg)
    assert "\n" not in str(caught.value)
    assert chunk_runner(act, None) is act
    with pytest.raises(ConfigError, match="at most the policy's chunk size 3"):
        chunk_runner(policy_fn(_state()), ValidateConfig(suite="s.yaml", min_success=0.5,
                                                         chunk={"execute": 4}))


@pytest.mark.parametrize(("how", "every"), [({"execute": 2}, 2), (None, K),
                                            ({"ensemble": 0.01}, 1)])
def test_validation_asks_for_a_chunk_only_when_one_is_due(how: dict[str, float] | None,
                                                          every: int) -> None:
    spec = get_task("reach-v0")
    torch.manual_seed(0)
    module = build_policy(spec.obs_dim, spec.act_dim, (16,), np.zeros(spec.obs_dim, np.float32),
                          np.ones(spec.obs_dim, np.float32), chunk_size=K)
    act = policy_fn(module)
    calls = []

    def counted(obs: np.ndarray) -> np.ndarray:
        calls.append(len(obs))
        return act(obs)

    counted.chunk_size = K  # type: ignore[attr-defined]
    runner = run_chunks(counted, how)
    assert isinstance(runner, ChunkRunner)
    assert getattr(runner, "chunk_size", None) is None
    env = spec.make_env(load_scene(SCENE), 3, 0)
    try:
        out = rollout(env, runner)
        steps = env.episode_steps
    finally:
        env.close()
    assert out.queries == len(calls) == -(-steps // every)
    assert set(calls) == {3}
    assert out.query_latency_ms is not None and out.query_latency_ms["p50"] > 0
    again = run_chunks(counted, how)
    env = spec.make_env(load_scene(SCENE), 3, 0)
    try:
        second = rollout(env, again)
    finally:
        env.close()
    np.testing.assert_array_equal(out.returns, second.returns)


def test_the_spec_validation_ran_is_what_the_manifest_records() -> None:
    act = policy_fn(_state())
    cfg = ValidateConfig(suite="s.yaml", min_success=0.5, chunk={"ensemble": 0.01})
    assert chunk_spec(act, cfg) == {"size": K, "ensemble": 0.01}
    assert chunk_spec(act, cfg.model_copy(update={"chunk": None})) == {"size": K, "execute": K}
    assert chunk_spec(policy_fn(_state(1)), None) is None


def test_a_suite_runs_the_chunks_as_its_gates_or_the_nightly_says() -> None:
    from stages.evaluation.rollout import Rollout
    from stages.evaluation.suite import evaluate_suite
    from stages.sections.models import ChunkConfig
    from stages.sim.suites.loading import load_suite

    suite = load_suite(ROOT / "tests" / "fixtures" / "suite_tiny.yaml")
    spec = get_task(suite.config.task)
    torch.manual_seed(0)
    act = policy_fn(build_policy(spec.obs_dim, spec.act_dim, (16,),
                                 np.zeros(spec.obs_dim, np.float32),
                                 np.ones(spec.obs_dim, np.float32), chunk_size=K))
    gates = ValidateConfig(suite="s.yaml", min_success=0.0, chunk={"execute": 2})
    ran: dict[str, Rollout] = {}
    evaluate_suite(suite, act, episodes=2, gates=gates, rollouts=ran)
    steps = {name: load_scene(entry.scene.path).config.episode_steps
             for name, entry in zip(ran, suite.scenes, strict=True)}
    assert {name: out.queries for name, out in ran.items()} == \
        {name: -(-n // 2) for name, n in steps.items()}
    evaluate_suite(suite, act, episodes=2, chunk=ChunkConfig(ensemble=0.01), rollouts=ran)
    assert {name: out.queries for name, out in ran.items()} == steps
    with pytest.raises(ConfigError, match=r"validate\.chunk"):
        evaluate_suite(suite, policy_fn(_state(1)), episodes=2, gates=gates)


def test_a_seeing_chunk_policy_is_built_saved_and_exported_with_its_chunks(
    tmp_path: Path
) -> None:
    from edge.export import export_onnx
    from edge.session import open_session
    from edge.verify import check_parity
    from stages.steps.train import new_policy, policy_meta

    spec = get_task("reach-vision-v0")
    camera = spec.cameras[0]
    frame = camera.shape(camera.image_key)
    rng = np.random.default_rng(0)
    data = Transitions(rng.normal(size=(20, spec.obs_dim)).astype(np.float32),
                       np.zeros((20, spec.act_dim), np.float32), np.repeat(np.arange(2), 10))
    cfg = TrainConfig(epochs=1, hidden=(16,), encoder_channels=(4, 4), chunk_size=K)
    torch.manual_seed(0)
    module = new_policy(cfg, spec, data, np.zeros(20, bool))
    meta = policy_meta(module, spec, cfg)
    assert meta["chunk_size"] == K and meta["kind"] == "vision" and meta["act_dim"] == spec.act_dim
    save_policy(module, tmp_path / "v.npz", meta)
    loaded, _ = load_policy(tmp_path / "v.npz")
    onnx_path = export_onnx(loaded, spec.obs_dim, tmp_path / "v.onnx",
                            images={camera.image_key: frame})
    session = open_session(onnx_path)
    assert session.chunk_size == K and dict(session.images) == {camera.image_key: frame}
    samples = {"obs": data.obs[:6],
               camera.image_key: rng.integers(0, 256, (6, *frame), dtype=np.uint8)}
    assert check_parity(loaded, onnx_path, samples, tolerance=1e-5).passed
    seeing: Any = load_actor(onnx_path)
    assert seeing(samples).shape == (6, K, spec.act_dim)


@pytest.mark.parametrize("stamp", [{"execute": 2}, {"ensemble": 0.01}])
def test_validation_runs_the_chunks_as_the_graphs_maker_said(tmp_path: Path,
                                                             stamp: dict[str, float]) -> None:
    """A LeRobot ACT's graph says how LeRobot ran it (``physai.chunk``: its n_action_steps or
    temporal ensembling, the mode parity was checked in); unset validate.chunk follows it,
    a set one wins, and a malformed stamp is one line."""
    import onnx

    from edge.export import export_onnx
    from stages.training.imported import with_chunking

    torch.manual_seed(0)
    module = _state()
    path = export_onnx(module, OBS_DIM, tmp_path / "p.onnx")
    assert chunk_spec(load_actor(path), None) == {"size": K, "execute": K}
    path.write_bytes(with_chunking(path.read_bytes(), {"size": K, **stamp}))
    assert chunk_spec(load_actor(path), None) == {"size": K, **stamp}
    assert chunk_spec(load_actor(path), ValidateConfig(suite="s.yaml", min_success=0.5,
                                                          chunk={"execute": 1})) \
        == {"size": K, "execute": 1}
    model = onnx.load(path)
    model.metadata_props[0].value = '{"execute": 9}'
    onnx.save(model, path)
    with pytest.raises(ConfigError, match=r"p.onnx: physai.chunk.*at most|p.onnx: physai.chunk"):
        load_actor(path)
