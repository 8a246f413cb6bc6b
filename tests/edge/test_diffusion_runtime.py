"""A diffusion policy's sampling on the robot and in validation: the observation history kept
as LeRobot's queues keep it, one seeded noise block a query, the scheduler's steps written as
the graph's schedule rows, the control loop and validation's chunk runner showing the policy
every step's observation, and the one-line refusals of a sampling the runtime cannot run. The
graph here is a stand-in; tests/lerobot/test_diffusion_parity.py checks a real one against
LeRobot and diffusers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge.runtime import (
    ControlLoop,
    DiffusionSampler,
    ObservationHistory,
    diffusion_problem,
    diffusion_schedule,
    diffusion_timesteps,
)
from stages.policies.local import DiffusionActor, run_chunks

OBS_DIM, ACT_DIM, HORIZON, N_OBS, N_ACTION = 3, 2, 8, 2, 4


def scheduler(kind: str = "DDPM", prediction: str = "epsilon") -> dict[str, Any]:
    """A scheduler of 100 training steps, linear betas, as diffusers records it."""
    betas = np.linspace(1e-4, 0.02, 100)
    spec: dict[str, Any] = {
        "type": kind, "num_train_timesteps": 100,
        "alphas_cumprod": [float(a) for a in np.cumprod(1 - betas).astype(np.float32)],
        "timestep_spacing": "leading", "steps_offset": 0, "prediction_type": prediction,
        "clip_sample": True, "clip_sample_range": 1.0, "thresholding": False}
    if kind == "DDPM":
        spec["variance_type"] = "fixed_small"
    else:
        spec["final_alpha_cumprod"] = 1.0
    return spec


def sampling(**changes: Any) -> dict[str, Any]:
    """A manifest's ``io.diffusion``."""
    return {"n_obs_steps": N_OBS, "horizon": HORIZON, "n_action_steps": N_ACTION, "steps": 10,
            "noise": {"generator": "numpy.random.PCG64", "seed": 7},
            "scheduler": scheduler()} | changes


class Graph:
    """A stand-in diffusion graph: records every feed, answers the history's last state."""

    def __init__(self) -> None:
        self.feeds: list[dict[str, np.ndarray]] = []

    def __call__(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        self.feeds.append({k: v.copy() for k, v in feed.items()})
        last = feed["obs"][:, -1, :ACT_DIM]
        return np.repeat(last[:, None], N_ACTION, axis=1).astype(np.float32)


def test_the_history_starts_filled_with_the_first_frame_then_slides() -> None:
    history = ObservationHistory(3)
    frame = lambda v: {"obs": np.full((2, 1), v, np.float32)}  # noqa: E731
    history.push(frame(1))
    assert history.stacked()["obs"][:, :, 0].tolist() == [[1, 1, 1], [1, 1, 1]]
    history.push(frame(2))
    history.push(frame(3))
    history.push(frame(4))
    assert history.stacked()["obs"][:, :, 0].tolist() == [[2, 3, 4], [2, 3, 4]]
    history.reset(np.array([False, True]))  # world 1's episode starts again
    history.push(frame(5))
    assert history.stacked()["obs"][:, :, 0].tolist() == [[3, 4, 5], [5, 5, 5]]


def test_a_query_feeds_the_history_a_seeded_noise_block_and_the_schedule() -> None:
    graph = Graph()
    sampler = DiffusionSampler(graph, sampling(), ACT_DIM)
    obs = np.arange(2 * OBS_DIM, dtype=np.float32).reshape(2, OBS_DIM)
    chunk = sampler({"obs": obs})
    assert chunk.shape == (2, N_ACTION, ACT_DIM)
    feed = graph.feeds[0]
    assert feed["obs"].shape == (2, N_OBS, OBS_DIM)
    assert feed["noise"].shape == (2, 11, HORIZON, ACT_DIM)
    assert feed["schedule"].shape == (10, 8)
    expected = np.random.Generator(np.random.PCG64(7)).standard_normal(
        (2, 11, HORIZON, ACT_DIM), dtype=np.float32)
    assert np.array_equal(feed["noise"], expected)
    sampler({"obs": obs})  # the generator goes on: the next query draws the next block
    assert not np.array_equal(graph.feeds[1]["noise"], expected)
    fewer = DiffusionSampler(graph, sampling(), ACT_DIM, steps=5)
    fewer({"obs": obs})
    assert graph.feeds[2]["noise"].shape == (2, 6, HORIZON, ACT_DIM)
    assert graph.feeds[2]["schedule"].shape == (5, 8)


def test_ddpm_timesteps_are_diffusers_leading_spacing_and_the_last_step_adds_no_noise() -> None:
    assert diffusion_timesteps(scheduler(), 10).tolist() == list(range(90, -1, -10))
    assert diffusion_timesteps(scheduler() | {"steps_offset": 1}, 4).tolist() == [76, 51, 26, 1]
    rows = diffusion_schedule(scheduler(), 10)
    assert rows[:, 0].tolist() == list(range(90, -1, -10))
    assert (rows[:-1, 6] > 0).all() and rows[-1, 6] == 0  # sigma: noise at every t > 0
    assert (rows[:, 7] == 1.0).all()  # clip_sample_range


@pytest.mark.parametrize("prediction", ["epsilon", "sample"])
def test_a_ddim_step_with_a_perfect_denoiser_lands_on_the_previous_noisy_sample(
    prediction: str
) -> None:
    """x_t = sqrt(a_t) x0 + sqrt(1 - a_t) eps; a network that answers eps (or x0) exactly
    takes DDIM (eta 0) to sqrt(a_prev) x0 + sqrt(1 - a_prev) eps, whatever the rows say."""
    sched = scheduler("DDIM", prediction)
    alphas = np.asarray(sched["alphas_cumprod"], np.float64)
    rng = np.random.default_rng(0)
    x0, eps = rng.uniform(-0.9, 0.9, 5), rng.standard_normal(5)
    rows = diffusion_schedule(sched, 10).astype(np.float64)
    for t, p, q, c_x0, c_s, c_o, sigma, r in rows:
        ab = alphas[int(t)]
        prev = int(t) - 10
        ab_prev = alphas[prev] if prev >= 0 else 1.0
        s = np.sqrt(ab) * x0 + np.sqrt(1 - ab) * eps
        o = eps if prediction == "epsilon" else x0
        x0_hat = np.clip(p * s + q * o, -r, r)
        stepped = c_x0 * x0_hat + c_s * s + c_o * o + sigma * 0.0
        np.testing.assert_allclose(x0_hat, x0, atol=1e-5)
        np.testing.assert_allclose(stepped, np.sqrt(ab_prev) * x0 + np.sqrt(1 - ab_prev) * eps,
                                   atol=1e-5)


@pytest.mark.parametrize(("changes", "says"), [
    ({"n_action_steps": 8}, "n_action_steps must be at most horizon - n_obs_steps + 1"),
    ({"steps": 0}, "steps must be a whole number 1 .. 1,000"),
    ({"noise": {"generator": "torch", "seed": 0}}, "noise must be {generator: numpy"),
    ({"scheduler": scheduler() | {"type": "PNDM"}}, "scheduler.type must be one of"),
    ({"scheduler": scheduler() | {"variance_type": "learned"}}, "variance_type must be"),
    ({"scheduler": scheduler() | {"alphas_cumprod": [0.5] * 99}}, "100 numbers in (0, 1]"),
    ({"steps": 101}, "num_train_timesteps must be a whole number >= steps"),
])
def test_a_sampling_the_runtime_cannot_run_is_one_line(changes: dict[str, Any],
                                                       says: str) -> None:
    assert diffusion_problem(sampling()) is None
    problem = diffusion_problem(sampling(**changes))
    assert problem is not None and says in problem and "\n" not in problem
    with pytest.raises(ValueError, match=r"io\.diffusion"):
        DiffusionSampler(Graph(), sampling(**changes), ACT_DIM)


class LoadedDiffusion:
    """What the control loop sees of a loaded diffusion bundle: a sampler behind ``infer``,
    ``observe`` and ``reset``, one world."""

    obs_dim, act_dim = OBS_DIM, ACT_DIM
    action_low, action_high = np.full(ACT_DIM, -10.0), np.full(ACT_DIM, 10.0)
    def __init__(self) -> None:
        self.chunk = {"size": N_ACTION, "execute": N_ACTION}
        self.graph = Graph()
        self.sampler = DiffusionSampler(self.graph, sampling(), ACT_DIM)
        self.observed = self.resets = 0

    def infer(self, obs: np.ndarray, images: Any = None) -> np.ndarray:
        return self.sampler({"obs": obs[None]})[0]

    def observe(self, obs: np.ndarray, images: Any = None) -> None:
        self.observed += 1
        self.sampler.observe({"obs": obs[None]})

    def reset(self) -> None:
        self.resets += 1
        self.sampler.reset()


class Replay:
    """A robot whose observations are given in advance."""

    def __init__(self, observations: np.ndarray) -> None:
        self.observations, self.t = observations, 0

    def read(self) -> np.ndarray:
        return self.observations[self.t].copy()

    def apply(self, action: np.ndarray) -> None:
        self.t += 1


def test_the_control_loop_shows_a_diffusion_policy_every_observation() -> None:
    policy = LoadedDiffusion()
    obs = np.arange(10 * OBS_DIM, dtype=np.float32).reshape(10, OBS_DIM)
    starts = iter([False] * 6 + [True] + [False] * 3)
    stats = ControlLoop(policy, Replay(obs), 50.0, new_episode=lambda: next(starts)).run(10)
    assert stats.safe_holds == 0
    # Steps 0 and 4 query (chunks of 4); 6 starts an episode, whose chunks and history restart.
    assert stats.queries == 3 and policy.observed == 7 and policy.resets == 1
    first, second, third = (feed["obs"][0, :, 0] for feed in policy.graph.feeds)
    assert first.tolist() == [0, 0]  # the first observation fills the history
    assert second.tolist() == [3 * OBS_DIM, 4 * OBS_DIM]  # step 3 was observed, not queried
    assert third.tolist() == [6 * OBS_DIM, 6 * OBS_DIM]  # a new episode: its first frame


class Session:
    """What :class:`~stages.policies.local.DiffusionActor` reads of an ONNX session."""

    inputs = ("obs",)

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def sampler(self, steps: int | None = None) -> DiffusionSampler:
        return DiffusionSampler(self.graph, sampling(), ACT_DIM, steps)


def test_validation_keeps_the_history_of_every_world() -> None:
    graph = Graph()
    runner = run_chunks(DiffusionActor(Session(graph)), None)
    assert runner.spec == {"size": N_ACTION, "execute": N_ACTION}
    runner.reset()
    for t in range(6):
        runner(np.full((2, OBS_DIM), t, np.float32))
    assert runner.queries == 2
    assert graph.feeds[1]["obs"][:, :, 0].tolist() == [[3, 4], [3, 4]]
    runner.reset(np.array([True, False]))  # world 0 starts again
    runner(np.full((2, OBS_DIM), 9, np.float32))
    assert graph.feeds[2]["obs"][:, :, 0].tolist() == [[9, 9], [5, 9]]
