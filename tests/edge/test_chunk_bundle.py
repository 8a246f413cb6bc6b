"""A bundle whose policy emits chunks of actions: the (batch, k, act_dim) export, its manifest's
``io.chunk``, the runtime's control loop asking only when a chunk is due, and the done-when
check: ACT's temporal ensembling gives the same actions in validation, in the runtime's
control loop and in ``flows bundle drive`` on the same observations."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edge.bench import onnx_latency
from edge.errors import BundleError, EdgeError
from edge.export import export_onnx
from edge.manifest import check_bundle
from edge.pack import pack_policy_bundle
from edge.runtime import ControlLoop, LoadedPolicy, RuntimeRefusal, load_bundle
from edge.session import open_session
from edge.targets import get_target
from edge.verify import check_parity
from stages.policies.local import build_policy, load_actor, save_policy
from stages.sim.tasks.catalog import get_task
from tests.edge.test_vision_bundle import FakeCuda as HostCuda

ROOT = Path(__file__).resolve().parents[2]
SCENE = ROOT / "sim_scenes" / "reach" / "nominal.yaml"
TASK = "reach-v0"
K = 5
ENSEMBLE = {"size": K, "ensemble": 0.01}


def chunk_policy(seed: int = 0) -> torch.nn.Module:
    """A random state policy of reach-v0 that emits chunks of K actions."""
    spec = get_task(TASK)
    torch.manual_seed(seed)
    return build_policy(spec.obs_dim, spec.act_dim, (32, 32), np.zeros(spec.obs_dim, np.float32),
                        np.full(spec.obs_dim, 0.5, np.float32), chunk_size=K)


def fields(chunk: dict[str, Any] | None = ENSEMBLE) -> dict[str, Any]:
    from tests.support import policy_manifest_fields

    spec = get_task(TASK)
    out = policy_manifest_fields([0.0] * spec.obs_dim, [0.5] * spec.obs_dim, spec.act_dim,
                                 task=TASK)
    if chunk is not None:
        out["io"]["actions"]["shape"] = ["batch", chunk["size"], spec.act_dim]
        out["io"]["chunk"] = dict(chunk)
    return out


@pytest.fixture(scope="module")
def policy_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The npz of a chunk policy and its ONNX export."""
    spec = get_task(TASK)
    folder = tmp_path_factory.mktemp("chunks")
    module = chunk_policy()
    npz = folder / "policy.npz"
    save_policy(module, npz, {"obs_dim": spec.obs_dim, "act_dim": spec.act_dim,
                              "hidden": [32, 32], "chunk_size": K})
    return npz, export_onnx(module, spec.obs_dim, folder / "policy.onnx")


def pack(folder: Path, onnx_path: Path, manifest: dict[str, Any]) -> Path:
    spec = get_task(TASK)
    out = folder / "bundle.tar"
    calibration = np.random.default_rng(0).normal(size=(32, spec.obs_dim)).astype(np.float32)
    pack_policy_bundle(out, onnx_path, calibration, "probes", manifest,
                       get_target("jetson-agx-orin"))
    return out


@pytest.fixture(scope="module")
def bundle(policy_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack(tmp_path_factory.mktemp("bundle"), policy_files[1], fields())


def test_the_export_emits_chunks_and_matches_torch_query_for_query(
    policy_files: tuple[Path, Path]
) -> None:
    spec = get_task(TASK)
    session = open_session(policy_files[1])
    assert (session.chunk_size, session.act_dim) == (K, spec.act_dim)
    assert session.session.get_outputs()[0].shape == ["batch", K, spec.act_dim]
    obs = np.random.default_rng(1).normal(size=(64, spec.obs_dim)).astype(np.float32)
    parity = check_parity(chunk_policy(), policy_files[1], obs, tolerance=1e-5)
    assert parity.passed and parity.samples == 64
    latency = onnx_latency(policy_files[1], spec.obs_dim, iters=50, warmup=5)
    assert latency.p50_us > 0
    act = load_actor(policy_files[1])
    assert getattr(act, "chunk_size", None) == K
    assert act(obs[:3]).shape == (3, K, spec.act_dim)


def test_the_manifest_records_the_chunks_and_is_checked_against_the_graph(
    bundle: Path, policy_files: tuple[Path, Path], tmp_path: Path
) -> None:
    manifest = check_bundle(bundle)
    assert manifest["io"]["chunk"] == ENSEMBLE
    assert manifest["io"]["actions"]["shape"][1] == K

    def refused(name: str, broken: dict[str, Any], onnx_path: Path = policy_files[1]) -> str:
        folder = tmp_path / name
        folder.mkdir()
        try:
            out = pack(folder, onnx_path, broken)
        except (BundleError, EdgeError) as exc:
            return str(exc)
        with pytest.raises(BundleError) as err:
            check_bundle(out)
        assert "\n" not in str(err.value)
        return str(err.value)

    none = fields(None)
    assert "differ from the manifest's field 'io.actions.shape'" in refused("one action", none)
    shape_only = copy.deepcopy(fields())
    del shape_only["io"]["chunk"]
    assert "needs field 'io.chunk'" in refused("no chunk", shape_only)
    wrong = fields({"size": K + 1, "execute": 2})
    assert "differ from the manifest's field 'io.actions.shape'" in refused("size", wrong)
    too_many = fields({"size": K, "execute": K + 1})
    assert "'io.chunk.execute' must be at most io.chunk.size" in refused("execute", too_many)
    both = fields({"size": K, "execute": 2})
    both["io"]["chunk"]["ensemble"] = 0.1
    assert "'io.chunk'" in refused("both", both)


def test_the_runtime_reads_io_chunk_and_infers_a_chunk(bundle: Path, tmp_path: Path) -> None:
    loaded = load_bundle(bundle, tmp_path / "run", providers=["CPUExecutionProvider"],
                         allow_unsigned=True)
    assert loaded.chunk == ENSEMBLE and loaded.action_shape == (K, loaded.act_dim)
    out = loaded.infer(np.zeros(loaded.obs_dim, np.float32))
    assert out.shape == (K, loaded.act_dim)


class Clock:
    """The runtime's clock in a test: every reading 1 us later, a sleep as long as asked, so
    no step is late however busy the machine (timing is not what these tests check)."""

    def __init__(self) -> None:
        self.ns = 0

    def perf_counter_ns(self) -> int:
        self.ns += 1000
        return self.ns

    def sleep(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


@pytest.fixture
def steady(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's control loop on :class:`Clock`."""
    from edge import runtime

    monkeypatch.setattr(runtime, "time", Clock())


class Replay:
    """A robot whose observations are given in advance; it records what it is told to do."""

    def __init__(self, observations: np.ndarray) -> None:
        self.observations = observations
        self.t = 0
        self.applied: list[np.ndarray] = []

    def read(self) -> np.ndarray:
        return self.observations[min(self.t, len(self.observations) - 1)].copy()

    def apply(self, action: np.ndarray) -> None:
        self.applied.append(np.asarray(action).copy())
        self.t += 1


class Counted:
    """A loaded policy whose calls are counted."""

    def __init__(self, policy: LoadedPolicy) -> None:
        self.policy, self.calls = policy, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def infer(self, obs: np.ndarray, images: Any = None) -> np.ndarray:
        self.calls += 1
        return self.policy.infer(obs)


@pytest.mark.parametrize(("how", "queries"), [({"execute": 2}, 5), ({"execute": K}, 2),
                                              ({"ensemble": 0.01}, 10)])
def test_the_control_loop_asks_only_when_a_chunk_is_due(
    bundle: Path, tmp_path: Path, how: dict[str, float], queries: int, steady: None
) -> None:
    loaded = load_bundle(bundle, tmp_path / "run", providers=["CPUExecutionProvider"],
                         allow_unsigned=True)
    policy = replace(loaded, chunk={"size": K, **how})
    counted = Counted(policy)
    obs = np.random.default_rng(2).normal(size=(10, loaded.obs_dim)).astype(np.float32)
    stats = ControlLoop(counted, Replay(obs), 100.0).run(10)
    assert stats.safe_holds == stats.inference_overruns == 0
    assert stats.queries == counted.calls == queries


def test_a_held_step_and_a_new_episode_start_the_chunks_afresh(bundle: Path, tmp_path: Path,
                                                               steady: None) -> None:
    loaded = load_bundle(bundle, tmp_path / "run", providers=["CPUExecutionProvider"],
                         allow_unsigned=True)
    policy = replace(loaded, chunk={"size": K, "execute": K})
    obs = np.random.default_rng(3).normal(size=(8, loaded.obs_dim)).astype(np.float32)
    obs[2, 0] = np.nan  # a malformed observation: the step holds, the chunk is forgotten
    robot = Replay(obs)
    counted = Counted(policy)
    starts = iter([False, False, False, False, False, True, False, False])
    stats = ControlLoop(counted, robot, 100.0, new_episode=lambda: next(starts)).run(8)
    assert stats.malformed_inputs == stats.safe_holds == 1
    # Steps 0 (first chunk), 3 (after the hold) and 5 (a new episode) query.
    assert counted.calls == stats.queries == 3


def test_the_runtime_refuses_an_io_chunk_it_cannot_run(
    policy_files: tuple[Path, Path], tmp_path: Path
) -> None:
    from edge.runtime import manifest_chunk

    folder = tmp_path / "b"
    folder.mkdir()
    out = pack(folder, policy_files[1], fields({"size": K, "execute": 1}))
    assert load_bundle(out, tmp_path / "ok", providers=["CPUExecutionProvider"],
                       allow_unsigned=True).chunk == {"size": K, "execute": 1}
    with pytest.raises(RuntimeRefusal, match=r"io\.chunk'.*execute must be 1\.\.5") as err:
        manifest_chunk(out, {"io": {"actions": {"shape": ["batch", K, 4]},
                                    "chunk": {"size": K, "execute": K + 3}}})
    assert "\n" not in str(err.value)
    with pytest.raises(RuntimeRefusal, match=r"needs field 'io\.chunk'"):
        manifest_chunk(out, {"io": {"actions": {"shape": ["batch", K, 4]}}})
    with pytest.raises(RuntimeRefusal, match=r"must be \['batch', 5, act_dim\]"):
        manifest_chunk(out, {"io": {"actions": {"shape": ["batch", 4]},
                                    "chunk": {"size": K, "ensemble": 0.1}}})


# --------------------------------------------------------------------------- the same actions


class Recording:
    """A batched environment that records the observations it gives and the actions it
    takes (world 0), everything else its own."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.observations: list[np.ndarray] = []
        self.actions: list[np.ndarray] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self) -> np.ndarray:
        obs: np.ndarray = self.env.reset()
        self.observations.append(obs[0].copy())
        return obs

    def step(self, actions: np.ndarray) -> Any:
        self.actions.append(np.asarray(actions)[0].copy())
        obs, reward, done = self.env.step(actions)
        if len(self.actions) < self.env.episode_steps:
            self.observations.append(obs[0].copy())
        return obs, reward, done


def test_temporal_ensembling_gives_the_same_actions_in_validation_runtime_and_drive(
    bundle: Path, policy_files: tuple[Path, Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], steady: None
) -> None:
    from flows.cli import main
    from stages.evaluation.robot import SimRobot
    from stages.evaluation.rollout import chunk_runner, rollout
    from stages.sections.models import ValidateConfig
    from stages.sim.backends.catalog import make_backend_env
    from stages.sim.suites.loading import load_scene

    spec, scene, seed = get_task(TASK), load_scene(SCENE), 7
    # Validation: the stage's rollout of the stored (torch) policy, ensembled as configured.
    cfg = ValidateConfig(suite="s.yaml", min_success=0.0, chunk={"ensemble": 0.01})
    env = Recording(make_backend_env("mujoco", spec, scene, 1, seed))
    try:
        out = rollout(env, chunk_runner(load_actor(policy_files[0]), cfg))
    finally:
        env.close()
    steps = scene.config.episode_steps
    assert out.queries == steps  # ensembling asks every step
    seen, done = np.array(env.observations), np.array(env.actions)
    assert seen.shape == (steps, spec.obs_dim) and done.shape == (steps, spec.act_dim)

    # The runtime: the bundle's control loop given validation's observations.
    loaded = load_bundle(bundle, tmp_path / "loop", providers=["CPUExecutionProvider"],
                         allow_unsigned=True)
    replay = Replay(seen)
    stats = ControlLoop(loaded, replay, 200.0).run(steps)
    assert stats.queries == steps and stats.safe_holds == 0
    np.testing.assert_allclose(np.array(replay.applied), done, atol=1e-5)

    # flows bundle drive: the same scene and seed through the runtime on a simulated robot.
    driven: list[tuple[np.ndarray, np.ndarray]] = []
    read, apply = SimRobot.read, SimRobot.apply

    def reads(self: SimRobot) -> np.ndarray:
        obs = read(self)
        driven.append((obs, np.zeros(0)))
        return obs

    def applies(self: SimRobot, action: np.ndarray) -> None:
        driven[-1] = (driven[-1][0], np.asarray(action).copy())
        apply(self, action)

    monkeypatch.setattr(SimRobot, "read", reads)
    monkeypatch.setattr(SimRobot, "apply", applies)
    code = main(["bundle", "drive", str(bundle), "--scene", str(SCENE), "--episodes", "1",
                 "--seed", str(seed), "--rate", "50", "--allow-unsigned"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert f"chunks of {K} (ensemble 0.01), {steps} queries" in printed
    drive_obs = np.array([o for o, _ in driven])
    drive_act = np.array([a for _, a in driven])
    np.testing.assert_allclose(drive_obs, seen, atol=1e-4)
    np.testing.assert_allclose(drive_act, done, atol=1e-4)
    # Ensembling is not the first action of each step's chunk: the mean over older chunks.
    first = np.array([loaded.infer(o)[0] for o in seen])
    assert np.abs(first - done).max() > 1e-3


# --------------------------------------------------------------------------- TensorRT path


class ChunkEngine:
    """A deserialized engine of the chunk graph: (1, obs_dim) -> (1, K, act_dim), run by ONNX
    Runtime on the bound host buffers."""

    num_io_tensors = 2

    def __init__(self, session: Any, cuda: HostCuda) -> None:
        self.session, self.cuda = session, cuda

    def get_tensor_name(self, i: int) -> str:
        return ["obs", "actions"][i]

    def create_execution_context(self) -> Any:
        engine = self

        class Context:
            def __init__(self) -> None:
                self.addresses: dict[str, int] = {}

            def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
                return True

            def get_tensor_shape(self, name: str) -> tuple[int, ...]:
                return (1, *engine.session.get_outputs()[0].shape[1:])

            def set_tensor_address(self, name: str, address: int) -> bool:
                self.addresses[name] = address
                return True

            def execute_async_v3(self, stream: int) -> bool:
                memory = engine.cuda.memory
                obs = memory[self.addresses["obs"]].view(np.float32).reshape(1, -1)
                out = engine.session.run(["actions"], {"obs": obs})[0]
                actions = memory[self.addresses["actions"]]
                actions[:] = out.astype(np.float32).view(np.uint8).ravel()
                return True

        return Context()


def test_the_tensorrt_path_binds_a_chunk_of_actions(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steady: None
) -> None:
    import json
    import sys
    import types
    from hashlib import sha256

    from edge import runtime
    from edge.runtime import TensorRTPolicy

    loaded = load_bundle(bundle, tmp_path / "run", providers=["CPUExecutionProvider"],
                         allow_unsigned=True)
    cuda = HostCuda()
    engine = ChunkEngine(loaded.session, cuda)

    class Logger:
        WARNING = 2

        def __init__(self, level: int) -> None:
            pass

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> ChunkEngine:
            return engine

    fake = types.SimpleNamespace(Runtime=Runtime, Logger=Logger, DataType=types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(runtime, "_cudart", lambda: cuda)
    data = b"stand-in engine"
    (tmp_path / "policy.fp16.engine").write_bytes(data)
    (tmp_path / "engine_report.json").write_text(json.dumps(
        {"manifest_sha256": loaded.manifest_sha256, "engine_sha256": sha256(data).hexdigest()}))
    policy = TensorRTPolicy(loaded, tmp_path / "policy.fp16.engine")
    try:
        obs = np.random.default_rng(5).normal(size=(6, loaded.obs_dim)).astype(np.float32)
        for row in obs[:3]:
            got = policy.infer(row)
            assert got.shape == (K, loaded.act_dim)
            np.testing.assert_allclose(got, loaded.infer(row), atol=1e-6)
        robot = Replay(obs)
        stats = ControlLoop(policy, robot, 100.0).run(6)
        assert stats.queries == 6 and stats.safe_holds == 0  # ensembling: a query a step
    finally:
        policy.close()


def test_bundle_inspect_says_how_the_chunks_run(bundle: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    assert main(["bundle", "verify", str(bundle), "--allow-unsigned"]) == 0
    assert f"chunk: {K} actions a query, run by ensemble 0.01" in capsys.readouterr().out
