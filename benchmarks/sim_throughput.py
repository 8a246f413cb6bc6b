"""Simulation throughput on locomotion-v0: C stepping, policy in the loop, and Gymnasium.

Three measurements in one run, all on the quadruped of ``sim_scenes/locomotion`` and counted in
world-steps per second (worlds x control steps x frame skip / wall seconds):

- ``raw``: the environment's worlds, randomized as in ``collect.yaml`` (masses, payload,
  damping, friction, gains, contact friction), stepped by the batch alone on every core with
  the servos holding the standing pose (zero actions); no policy, no observations.
- ``policy``: validation through our environment, as the validate stage runs it: reset, then a
  whole episode in which one torch call of an MLP (50 -> 256 -> 256 -> 12, tanh) computes the
  actions of all worlds every control step. The scene is ``collect.yaml``, pushes included.
- ``gymnasium``: the same MJCF wrapped in ``gymnasium.envs.mujoco.MujocoEnv`` (the same
  observation and frame skip), run by Gymnasium's synchronous and asynchronous vector envs
  with the same policy called once per step for all of them; the faster one is reported.
  ``AsyncVectorEnv`` starts a process per environment, so it runs ``2 x os.cpu_count()``
  environments rather than all of them.

``episode_records_share`` (target <= 0.05) is the share of one validation episode plus its
per-episode records (:mod:`stages.evaluation.episodes`: every world's conditions and outcome, the
sensitivity fit, the Parquet file) that the records take.

- ``overlapped``: the same validation episode with the worlds split into ``--overlap-groups``
  groups (:mod:`stages.sim.env.overlap`), each an environment of its own seed stepping on its
  share of the cores (one C thread each for two groups on two cores) while the policy runs
  for another group (the MLP called once per group and step).
  ``ratio_overlapped_policy_over_raw`` (target >= 0.9) is the median of the per-round ratios
  to raw stepping, ``ratio_overlapped_over_policy`` that to the policy run of the same round,
  and ``overlapped_policy_call_share`` the time spent in the MLP, summed over the groups'
  threads, over the overlapped episode's wall time (where the policy runs beside the physics,
  no longer on top; above 1 where several groups' calls run at once).
- ``replay``: raw C stepping of the same work as the overlapped episode. Every group's controls
  and pushes are recorded as its episode runs, then a fresh environment of the same worlds and
  seed steps them on every core with nothing else in the loop (no policy, observation or
  reward), one group after the other; it must end in the episode's final state, bit for bit,
  or the benchmark exits. ``raw`` holds the robots standing, while the episode's robots walk,
  stumble and fall, which makes more contacts: ``ratio_replay_over_raw`` is what the physics of
  the episode's own motion reaches against ``raw``, so the most any overlap of the policy can
  reach; ``ratio_overlapped_policy_over_replay`` is what the policy and the task's Python still
  cost once overlapped, against the same physics.

Raw, policy and overlapped runs alternate ``--repeat`` times; ``ratio_policy_over_raw``
(target >= 0.8) is the median of the per-pair ratios, so a burst of other load hits both sides
of a pair.
``ratio_policy_over_gymnasium`` (target >= 2.5) divides the median policy rate by the faster
Gymnasium mode. The line also carries the share of policy time spent in the MLP and the load
average before and after, which shows whether other work shared the CPUs. The MLP runs on one
torch thread: torch's OpenMP workers spinning next to the stepping threads slow both down.

With ``--policy-device cuda`` the MLP runs on the GPU and only the physics and the task's
Python stay on the cores (``scripts/gpu_check.sh`` runs it so when a GPU is lent).

    python benchmarks/sim_throughput.py [--worlds 256] [--repeat 3] [--policy-device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
COLLECT_SCENE = ROOT / "sim_scenes" / "locomotion" / "collect.yaml"
RAW_CONTROL_STEPS = 250
"""Control steps of each raw-stepping run: one episode's worth."""
OVERLAP_GROUPS = 2
"""Groups of the overlapped validation (``--overlap-groups``): two, one stepping while the
other's policy runs."""

PolicyFn = Callable[[np.ndarray], np.ndarray]


def make_policy(obs_dim: int, act_dim: int, device: str = "cpu") -> PolicyFn:
    """An MLP ``obs -> 256 -> 256 -> actions`` (ELU, tanh output) on one CPU thread, or on
    ``device`` (e.g. ``cuda``: observations go over and actions come back every call).

    Returns:
        A function from observations (N, obs_dim) to actions (N, act_dim), float32.
    """
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(obs_dim, 256),
        torch.nn.ELU(),
        torch.nn.Linear(256, 256),
        torch.nn.ELU(),
        torch.nn.Linear(256, act_dim),
        torch.nn.Tanh(),
    ).eval().to(device)

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return net(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()

    return act


def raw_rate(worlds: int, control_steps: int) -> float:
    """World-steps/s of the randomized worlds stepped by the batch alone, zero actions."""
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.locomotion import LocomotionEnv

    env = LocomotionEnv(load_scene(COLLECT_SCENE), worlds, 0)
    env.reset()
    batch, frame_skip = env.batch, env.frame_skip
    start = time.perf_counter()
    for _ in range(control_steps):
        batch.step(nstep=frame_skip)
    return worlds * control_steps * frame_skip / (time.perf_counter() - start)


def policy_rate(worlds: int, act: PolicyFn) -> tuple[float, float, float]:
    """World-steps/s of one whole validation episode through our environment, the share of
    that time spent in the policy, and the share of the episode plus its per-episode
    records (conditions and outcomes, the sensitivity fit, the Parquet file) spent on the
    records."""
    import tempfile

    from stages.evaluation.episodes import episode_table, write_parquet
    from stages.evaluation.sensitivity import factor_effects
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.locomotion import LocomotionEnv

    env = LocomotionEnv(load_scene(COLLECT_SCENE), worlds, 0)
    in_policy = 0.0
    returns = np.zeros(worlds)
    start = time.perf_counter()
    obs = env.reset()
    for _ in range(env.episode_steps):
        before = time.perf_counter()
        actions = act(obs)
        in_policy += time.perf_counter() - before
        obs, reward, _ = env.step(actions)
        returns += reward
    seconds = time.perf_counter() - start
    before = time.perf_counter()
    columns, units = episode_table(env, env.success(), returns, env.fallen())
    factor_effects(columns, units)
    with tempfile.TemporaryDirectory() as tmp:
        write_parquet(Path(tmp) / "episodes.parquet", columns, units)
    recording = time.perf_counter() - before
    return (worlds * env.episode_steps * env.frame_skip / seconds, in_policy / seconds,
            recording / (seconds + recording))


class StepRecorder:
    """What one environment's physics was given, step by step: the controls each
    ``frame_skip`` step ran under and the pushes added to the bases before it, recorded by
    wrapping the environment's own ``_advance`` and ``_kick``, so that :meth:`replay` can step
    a fresh copy of the same worlds through the same motion with nothing else in the loop."""

    def __init__(self, env: Any, seed: int) -> None:
        """Record ``env`` (a :class:`~stages.sim.tasks.locomotion.LocomotionEnv` seeded
        ``seed``)."""
        self.env, self.seed = env, seed
        self.controls: list[np.ndarray] = []
        self.kicks: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        advance, kick = env._advance, env._kick

        def recorded_advance() -> None:
            self.controls.append(np.array(env._ctrl))
            advance()

        def recorded_kick(worlds: np.ndarray, velocity: np.ndarray) -> None:
            self.kicks.setdefault(len(self.controls), []).append((worlds.copy(), velocity.copy()))
            kick(worlds, velocity)

        env._advance, env._kick = recorded_advance, recorded_kick

    def replay(self) -> float:
        """Seconds a fresh environment of the same worlds (same seed, so the same draws;
        every core) takes to step the recorded controls and pushes after its reset: raw C
        stepping of the same work. Exits if it does not end in the recorded final state."""
        from stages.sim.suites.loading import load_scene
        from stages.sim.tasks.locomotion import LocomotionEnv

        env = LocomotionEnv(load_scene(COLLECT_SCENE), self.env.num_worlds, self.seed)
        env.reset()
        ctrl, kicks = env._ctrl, self.kicks
        start = time.perf_counter()
        for k, controls in enumerate(self.controls):
            for worlds, velocity in kicks.get(k, ()):
                env._kick(worlds, velocity)
            ctrl[:] = controls
            env._advance()
        seconds = time.perf_counter() - start
        if not np.array_equal(np.asarray(env._qpos), np.asarray(self.env._qpos)):
            raise SystemExit("the replay did not reproduce the episode's final state")
        return seconds


def overlapped_rate(worlds: int, act: PolicyFn, groups: int) -> tuple[float, float, float]:
    """World-steps/s of one whole validation episode of the same scene split into ``groups``
    groups (:class:`stages.sim.env.overlap.GroupedEnv`, each stepping on its share of the C
    threads while the policy runs for another), as ``rollout`` runs it for a policy of the state
    alone; the time spent in the policy, summed over the groups' threads, over it; and the
    world-steps/s of raw C stepping of the same work (:class:`StepRecorder`: every group's
    worlds replayed through the same controls and pushes on every core, one group after the
    other, with no policy, observation or reward)."""
    from stages.sim.env.overlap import GroupedEnv, group_seed, grouped_env
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.locomotion import FRAME_SKIP, LocomotionEnv

    scene = load_scene(COLLECT_SCENE)
    env = grouped_env(lambda n, seed, threads: LocomotionEnv(scene, n, seed, num_threads=threads),
                      worlds, 0, groups)
    if not isinstance(env, GroupedEnv):
        raise SystemExit("--overlap-groups must be at least 2")
    recorders = [StepRecorder(e, group_seed(0, g)) for g, e in enumerate(env.groups)]
    in_policy = 0.0

    def timed(obs: np.ndarray) -> np.ndarray:
        nonlocal in_policy
        before = time.perf_counter()
        actions = act(obs)
        in_policy += time.perf_counter() - before
        return actions

    start = time.perf_counter()
    env.episode(timed)
    seconds = time.perf_counter() - start
    replayed = sum(r.replay() for r in recorders)
    env.close()
    world_steps = worlds * env.episode_steps * FRAME_SKIP
    return world_steps / seconds, in_policy / seconds, world_steps / replayed


def gymnasium_env_class() -> type[Any]:
    """A ``gymnasium.envs.mujoco.MujocoEnv`` of the quadruped with locomotion-v0's observation."""
    from gymnasium import spaces
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    from stages.sim.tasks import locomotion
    class QuadrupedGymEnv(MujocoEnv):
        """locomotion-v0's robot, observation and action as a single Gymnasium env."""

        metadata = {  # noqa: RUF012
            "render_modes": ["human", "rgb_array", "depth_array", "rgbd_tuple"],
            "render_fps": int(locomotion.CONTROL_HZ),
        }

        def __init__(self) -> None:
            obs_space = spaces.Box(-np.inf, np.inf, (len(locomotion.OBS_NAMES),), np.float64)
            super().__init__(str(locomotion.QUADRUPED_XML), locomotion.FRAME_SKIP, obs_space)
            self.action_space = spaces.Box(-1.0, 1.0, (locomotion.NUM_JOINTS,), np.float32)
            self._default = self.model.key("stand").ctrl.copy()
            self._stand = self.model.key("stand").qpos.copy()
            self._low, self._high = self.model.actuator_ctrlrange.T
            self._command = np.zeros(3)
            self._last = np.zeros(locomotion.NUM_JOINTS)

        def step(
            self, action: np.ndarray
        ) -> tuple[np.ndarray, np.float64, bool, bool, dict[str, np.float64]]:
            action = np.clip(action, -1.0, 1.0)
            ctrl = np.clip(self._default + locomotion.ACTION_SCALE * action, self._low, self._high)
            self.do_simulation(ctrl, self.frame_skip)
            self._last = action
            obs = self._observation()
            reward = np.exp(-np.sum((obs[:2] - self._command[:2]) ** 2) / 0.25)
            return obs, reward, bool(self.data.qpos[2] < locomotion.FALL_HEIGHT), False, {}

        def reset_model(self) -> np.ndarray:
            qpos = self._stand.copy()
            qpos[7:] += self.np_random.uniform(-0.05, 0.05, locomotion.NUM_JOINTS)
            self.set_state(qpos, np.zeros(self.model.nv))
            self.data.ctrl[:] = self._default
            self._command = self.np_random.uniform([0.2, 0.0, 0.0], [0.6, 0.0, 0.0])
            self._last = np.zeros(locomotion.NUM_JOINTS)
            return self._observation()

        def _observation(self) -> np.ndarray:
            rot = locomotion.rotation_matrices(self.data.qpos[None, 3:7])[0]
            phase = 2.0 * np.pi * self.data.time / locomotion.GAIT.period
            return np.concatenate(
                [
                    rot.T @ self.data.qvel[0:3],
                    self.data.qvel[3:6],
                    -rot[2],
                    self._command,
                    self.data.qpos[7:],
                    self.data.qvel[6:],
                    self._last,
                    [np.sin(phase), np.cos(phase)],
                ]
            )

    return QuadrupedGymEnv


def gymnasium_rate(num_envs: int, steps: int, act: PolicyFn, asynchronous: bool) -> float:
    """World-steps/s of Gymnasium's vector env of ``num_envs`` quadrupeds, one policy call per
    step; start-up and reset are not timed."""
    from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

    env_class = gymnasium_env_class()
    fns = [env_class for _ in range(num_envs)]
    envs = AsyncVectorEnv(fns) if asynchronous else SyncVectorEnv(fns)
    try:
        obs, _ = envs.reset(seed=0)
        start = time.perf_counter()
        for _ in range(steps):
            obs, *_ = envs.step(act(obs.astype(np.float32)))
        seconds = time.perf_counter() - start
    finally:
        envs.close()
    from stages.sim.tasks.locomotion import FRAME_SKIP

    return num_envs * steps * FRAME_SKIP / seconds


def main() -> None:
    """Measure raw, policy-in-the-loop and Gymnasium rates; print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gym-steps", type=int, default=40)
    parser.add_argument("--overlap-groups", type=int, default=OVERLAP_GROUPS)
    parser.add_argument("--policy-device", default="cpu",
                        help="where the MLP runs (cpu: one torch thread; cuda: the GPU, the "
                        "worlds staying on the CPU's cores)")
    args = parser.parse_args()

    from stages.sim.env.mujoco_env import default_num_threads
    from stages.sim.tasks.locomotion import NUM_JOINTS, OBS_NAMES

    load_before = os.getloadavg()
    torch.set_num_threads(1)
    act = make_policy(len(OBS_NAMES), NUM_JOINTS, args.policy_device)
    policy_rate(8, act)
    overlapped_rate(8, act, 2)
    raw, policy, share, recording, overlapped, overlapped_share = [], [], [], [], [], []
    replay: list[float] = []
    for _ in range(args.repeat):
        raw.append(raw_rate(args.worlds, RAW_CONTROL_STEPS))
        rate, policy_share, record_share = policy_rate(args.worlds, act)
        policy.append(rate)
        share.append(policy_share)
        recording.append(record_share)
        rate, policy_share, replayed = overlapped_rate(args.worlds, act, args.overlap_groups)
        overlapped.append(rate)
        overlapped_share.append(policy_share)
        replay.append(replayed)
    sync = gymnasium_rate(args.worlds, args.gym_steps, act, asynchronous=False)
    async_envs = 2 * (os.cpu_count() or 1)
    asynchronous = gymnasium_rate(async_envs, 4 * args.gym_steps, act, asynchronous=True)
    a, b = statistics.median(raw), statistics.median(policy)
    pair_ratio = statistics.median(p / r for p, r in zip(policy, raw, strict=True))
    overlap_ratio = statistics.median(p / r for p, r in zip(overlapped, raw, strict=True))
    c = max(sync, asynchronous)
    print(json.dumps({
        "benchmark": "sim_throughput",
        "task": "locomotion-v0",
        "worlds": args.worlds,
        "threads": default_num_threads(),
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "raw_world_steps_per_s": round(a),
        "policy_world_steps_per_s": round(b),
        "gymnasium_sync_world_steps_per_s": round(sync),
        "gymnasium_async_world_steps_per_s": round(asynchronous),
        "gymnasium_async_envs": async_envs,
        "gymnasium_mode": "sync" if sync >= asynchronous else "async",
        "ratio_policy_over_raw": round(pair_ratio, 3),
        "target_policy_over_raw_min": 0.8,
        "ratio_policy_over_gymnasium": round(b / c, 2),
        "target_policy_over_gymnasium_min": 2.5,
        "raw_runs": [round(x) for x in raw],
        "policy_runs": [round(x) for x in policy],
        "policy_call_share": round(statistics.median(share), 3),
        "episode_records_share": round(statistics.median(recording), 4),
        "target_episode_records_share_max": 0.05,
        "overlap_groups": args.overlap_groups,
        "policy_device": args.policy_device,
        "overlapped_policy_world_steps_per_s": round(statistics.median(overlapped)),
        "overlapped_policy_runs": [round(x) for x in overlapped],
        "ratio_overlapped_policy_over_raw": round(overlap_ratio, 3),
        "target_overlapped_policy_over_raw_min": 0.9,
        "ratio_overlapped_over_policy": round(statistics.median(
            o / p for o, p in zip(overlapped, policy, strict=True)), 3),
        "overlapped_policy_call_share": round(statistics.median(overlapped_share), 3),
        "replay_world_steps_per_s": round(statistics.median(replay)),
        "ratio_replay_over_raw": round(statistics.median(
            p / r for p, r in zip(replay, raw, strict=True)), 3),
        "ratio_overlapped_policy_over_replay": round(statistics.median(
            o / p for o, p in zip(overlapped, replay, strict=True)), 3),
        "load_avg_1m_before": round(load_before[0], 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
