"""Overlapped rollouts give exactly the outcomes of the same groups stepped one after another."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from stages.evaluation.rollout import Rollout, rollout
from stages.sim.env.batched import THREADS_ENV
from stages.sim.env.overlap import GroupedEnv, group_seed, group_sizes, group_threads, grouped_env
from stages.sim.scenes.scene import Scene
from stages.sim.suites.loading import load_scene
from stages.sim.tasks.locomotion import LocomotionEnv

ROOT = Path(__file__).resolve().parents[3]
COLLECT = ROOT / "sim_scenes" / "locomotion" / "collect.yaml"
"""Randomized masses, gains and friction, pushes and observation noise: every kind of draw."""


def policy(obs: np.ndarray) -> np.ndarray:
    """A fixed nonlinear function of each world's observation alone."""
    weights = np.random.default_rng(7).normal(0.0, 0.3, (obs.shape[1], 12))
    return np.tanh(obs.astype(np.float64) @ weights).astype(np.float32)


def make(scene: Scene) -> Callable[[int, int, int | None], LocomotionEnv]:
    """The factory :func:`grouped_env` takes, of ``scene``'s environments."""
    def build(worlds: int, seed: int, threads: int | None) -> LocomotionEnv:
        return LocomotionEnv(scene, worlds, seed, num_threads=threads)
    return build


@pytest.fixture(scope="module")
def scene() -> Scene:
    """The collect scene, its episodes cut to 60 control steps (pushes every 40 to 80)."""
    return load_scene(COLLECT).replace(episode_steps=60)


def outcomes(out: Rollout) -> dict[str, np.ndarray]:
    """Everything a rollout says of each world."""
    return {"success": out.success, "returns": out.returns, "final": out.final_reward,
            **{f"episodes.{k}": v for k, v in (out.episodes or {}).items()}}


def test_group_sizes_and_seeds() -> None:
    assert group_sizes(10, 3) == [4, 3, 3]
    assert group_sizes(4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="cannot split 2 worlds into 3"):
        group_sizes(2, 3)
    assert group_seed(5, 0) == 5
    assert group_seed(5, 1) == int(np.random.SeedSequence([5, 1]).generate_state(1)[0])
    assert group_seed(5, 1) != group_seed(5, 2)


def test_groups_share_the_stepping_threads(scene: Scene, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """Each group steps on its share of the stepping threads, at least one: every core is
    used on a machine of more cores than groups."""
    asked: list[int | None] = []

    def build(worlds: int, seed: int, threads: int | None) -> LocomotionEnv:
        asked.append(threads)
        return make(scene)(worlds, seed, threads)

    for cores, groups, each in ((16, 2, 8), (2, 2, 1), (1, 2, 1), (7, 3, 2)):
        monkeypatch.setenv(THREADS_ENV, str(cores))
        assert group_threads(groups) == each
    monkeypatch.setenv(THREADS_ENV, "16")
    env = grouped_env(build, 20, 0, 2)
    assert isinstance(env, GroupedEnv)
    assert asked == [8, 8]
    assert [group.batch.nthread for group in env.groups] == [8, 8]  # type: ignore[attr-defined]
    env.close()


def test_overlap_gives_the_sequential_outcomes(scene: Scene) -> None:
    """Per world and per seed: success, return, last reward and every episode condition."""
    on = grouped_env(make(scene), 10, 11, 3, overlap=True)
    off = grouped_env(make(scene), 10, 11, 3, overlap=False)
    assert isinstance(on, GroupedEnv) and isinstance(off, GroupedEnv)
    assert on._threaded and not off._threaded
    try:
        first, second = rollout(on, policy), rollout(off, policy)
    finally:
        on.close()
        off.close()
    a, b = outcomes(first), outcomes(second)
    assert a.keys() == b.keys() and "episodes.pushes" in a and a["episodes.pushes"].sum() > 0
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_each_group_is_its_environment_alone(scene: Scene) -> None:
    """Group g of a grouped scene is the environment of its size and seed run by itself."""
    grouped = grouped_env(make(scene), 7, 4, 2)
    try:
        together = rollout(grouped, policy)
    finally:
        grouped.close()
    start = 0
    for g, size in enumerate(group_sizes(7, 2)):
        alone_env = LocomotionEnv(scene, size, group_seed(4, g))
        alone = rollout(alone_env, policy)
        part = slice(start, start + size)
        np.testing.assert_array_equal(together.success[part], alone.success)
        np.testing.assert_array_equal(together.returns[part], alone.returns)
        for key, values in (alone.episodes or {}).items():
            if key != "episode":
                np.testing.assert_array_equal((together.episodes or {})[key][part], values)
        start += size


def test_one_group_is_the_plain_environment(scene: Scene) -> None:
    env = grouped_env(make(scene), 5, 2, 1)
    assert isinstance(env, LocomotionEnv) and env.num_worlds == 5


def test_filmed_rollout_watches_group_zero(scene: Scene) -> None:
    """Body poses of the first worlds are recorded at every step, as in the plain rollout."""
    from stages.evaluation.rollout import VideoSpec

    grouped = grouped_env(make(scene), 6, 1, 2)
    video = VideoSpec(episodes=2, width=8, height=8, every=10, camera="track")
    try:
        out = rollout(grouped, policy, video)
    finally:
        grouped.close()
    alone = LocomotionEnv(scene, 3, 1)
    plain = rollout(alone, policy, video)
    assert out.poses is not None and plain.poses is not None
    np.testing.assert_array_equal(out.poses, plain.poses)
    assert len(out.frames) == len(plain.frames)


def test_an_error_in_a_group_reaches_the_caller(scene: Scene) -> None:
    """Actions a group refuses raise in the caller, and the group threads end."""
    grouped = grouped_env(make(scene), 4, 0, 2)
    assert isinstance(grouped, GroupedEnv)

    def broken(obs: np.ndarray) -> np.ndarray:
        return np.full((obs.shape[0], 12), np.nan, np.float32)

    try:
        with pytest.raises(ValueError, match="NaN or infinity"):
            grouped.episode(broken)
    finally:
        grouped.close()
    import threading

    assert not [t for t in threading.enumerate() if t.name.startswith("group-")]


def test_validate_section_takes_overlap_groups() -> None:
    """``validate.overlap_groups``: 1 unless set, a positive count."""
    from pydantic import ValidationError

    from stages.sections.models import ValidateConfig

    base = {"suite": "suite.yaml", "min_success": 0.5}
    assert ValidateConfig(**base).overlap_groups == 1
    assert ValidateConfig(**base, overlap_groups=2).overlap_groups == 2
    with pytest.raises(ValidationError, match="overlap_groups"):
        ValidateConfig(**base, overlap_groups=0)


def test_the_validate_stage_runs_grouped_scenes(
        physai_home: Path, tiny_config: Callable[..., Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``validate.overlap_groups: 2`` reaches the stage: every scene runs its overlapped
    episode and is judged on all its episodes, the filmed ones from group 0."""
    from stages.orchestration.context import NullProgress
    from stages.pipeline.config import load_pipeline
    from stages.pipeline.run import run_direct

    episodes = []
    overlapped = GroupedEnv.episode

    def counted(self: GroupedEnv, *args: object, **kwargs: object) -> object:
        episodes.append(self.num_worlds)
        return overlapped(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(GroupedEnv, "episode", counted)
    pipeline = load_pipeline(tiny_config(validate={"overlap_groups": 2, "video_episodes": 1}))
    assert pipeline.config.validate_.overlap_groups == 2
    result = run_direct(pipeline, NullProgress())
    counts = {s.scene: s.episodes for s in result.report.scenes}
    assert counts and all(n > 1 for n in counts.values())
    assert sorted(episodes) == sorted(counts.values())
    assert all(s.video_digest for s in result.report.scenes)


VISION_TINY = ROOT / "tests" / "fixtures" / "reach_vision_scene_tiny.yaml"


class SeeingPolicy:
    """Actions from each world's state vector and camera image alone: a fixed random map of
    both, so a frame off by one level in one pixel changes that world's actions."""

    inputs = ("obs", "front_image")

    def __init__(self, obs_dim: int, act_dim: int, pixels: int) -> None:
        rng = np.random.default_rng(3)
        self.state = rng.normal(0.0, 0.3, (obs_dim, act_dim))
        self.image = rng.normal(0.0, 1e-4, (pixels, act_dim))
        self.calls: list[int] = []

    def __call__(self, observation: dict[str, np.ndarray]) -> np.ndarray:
        obs = observation["obs"].astype(np.float64)
        image = observation["front_image"].astype(np.float64).reshape(len(obs), -1)
        self.calls.append(len(obs))
        return np.tanh(obs @ self.state + image @ self.image).astype(np.float32)


@pytest.mark.parametrize("tiles", ["off", "on"])
def test_a_policy_that_sees_runs_per_group_with_the_sequential_outcomes(tiles: str) -> None:
    """A camera policy in an overlapped episode: each group renders its own worlds' frames on
    its own thread, and every world's outcome, and the frames kept of the first worlds, are
    those of the groups run one after another and of group 0 run alone."""
    from stages.sim.tasks.catalog import get_task

    spec = get_task("reach-vision-v0")
    scene = load_scene(VISION_TINY)

    def build(worlds: int, seed: int, threads: int | None) -> object:
        env = spec.make_env(scene, worlds, seed, num_threads=threads)
        env.camera_tiles = tiles  # type: ignore[attr-defined]
        return env

    def seeing() -> SeeingPolicy:
        return SeeingPolicy(spec.obs_dim, spec.act_dim, 64 * 64 * 3)

    runs = {}
    for overlap in (True, False):
        env = grouped_env(build, 6, 5, 2, overlap=overlap)  # type: ignore[arg-type]
        assert isinstance(env, GroupedEnv) and env._threaded is overlap
        policy = seeing()
        try:
            runs[overlap] = rollout(env, policy)
        finally:
            env.close()
        assert sorted(set(policy.calls)) == [3], policy.calls  # once per group and step
        assert len(policy.calls) == 2 * scene.config.episode_steps
    a, b = outcomes(runs[True]), outcomes(runs[False])
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert len(set(runs[True].returns.tolist())) == 6
    for g in range(2):  # each group sees its own worlds, as its environment alone does
        alone_env = build(3, group_seed(5, g), None)
        try:
            alone = rollout(alone_env, seeing())  # type: ignore[arg-type]
        finally:
            alone_env.close()  # type: ignore[attr-defined]
        np.testing.assert_array_equal(runs[True].returns[3 * g:3 * g + 3], alone.returns)
        if g == 0:
            for out in (runs[True], runs[False]):
                assert out.seen is not None and alone.seen is not None
                np.testing.assert_array_equal(out.seen["front_image"],
                                              alone.seen["front_image"])


def test_a_policy_that_sees_more_worlds_than_group_zero_holds_steps_them_together() -> None:
    """Frames kept of 2 worlds, group 0 of 1: the groups step together, the policy given
    every group's frames at once, and each world's outcome is still its group's alone."""
    from stages.sim.tasks.catalog import get_task

    spec = get_task("reach-vision-v0")
    scene = load_scene(VISION_TINY)

    def build(worlds: int, seed: int, threads: int | None) -> object:
        return spec.make_env(scene, worlds, seed, num_threads=threads)

    env = grouped_env(build, 2, 5, 2)  # type: ignore[arg-type]
    assert isinstance(env, GroupedEnv) and env.first_group_worlds() == 1
    policy = SeeingPolicy(spec.obs_dim, spec.act_dim, 64 * 64 * 3)
    try:
        together = rollout(env, policy)
    finally:
        env.close()
    assert set(policy.calls) == {2}  # all worlds in one call: not per group
    for g in range(2):
        alone_env = build(1, group_seed(5, g), None)
        try:
            alone = rollout(alone_env, SeeingPolicy(spec.obs_dim, spec.act_dim,  # type: ignore[arg-type]
                                                    64 * 64 * 3))
        finally:
            alone_env.close()  # type: ignore[attr-defined]
        np.testing.assert_array_equal(together.returns[g:g + 1], alone.returns)


def test_the_validate_stage_runs_a_camera_policy_per_group(
        physai_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``validate.overlap_groups: 2`` with a policy that reads the camera (the tiny vision
    pipeline, tiles over worker processes): the scene runs its overlapped episode, each group
    rendering its own frames, and group 0 is filmed."""
    import yaml

    from stages.orchestration.context import NullProgress
    from stages.pipeline.config import load_pipeline
    from stages.pipeline.run import run_direct

    fixtures = ROOT / "tests" / "fixtures"
    config = yaml.safe_load((fixtures / "reach_vision_tiny.yaml").read_text())
    config["collect"]["scene"] = str(fixtures / config["collect"]["scene"])
    config["validate"]["suite"] = str(fixtures / config["validate"]["suite"])
    config["validate"].update(overlap_groups=2, video_episodes=1)
    config["train"].pop("dagger")
    path = tmp_path / "vision.yaml"
    path.write_text(yaml.safe_dump(config))
    grouped: list[tuple[int, bool]] = []
    overlapped = GroupedEnv.episode

    def counted(self: GroupedEnv, *args: object, **kwargs: object) -> object:
        grouped.append((self.num_worlds, kwargs.get("policy_of") is not None))
        return overlapped(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(GroupedEnv, "episode", counted)
    result = run_direct(load_pipeline(path), NullProgress())
    (scene,) = result.report.scenes
    assert grouped == [(scene.episodes, True)]
    assert scene.video_digest  # group 0's filmed world, its camera frames beside
