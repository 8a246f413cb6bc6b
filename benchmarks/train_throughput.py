"""PPO training throughput on locomotion-v0 against raw batched stepping of the same worlds.

Two measurements in one run, on the quadruped in ``sim_scenes/locomotion/train.yaml`` (the
scene ``configs/locomotion.yaml`` trains in: randomized masses, payload, gains, friction,
pushes) with the same world count, both counted in control steps per second (worlds x
control steps / wall seconds):

- ``raw``: the worlds stepped by ``mujoco.batch`` alone (``frame_skip`` physics steps per
  control step), servos holding the standing pose; no policy, no observations, no learning.
- ``ppo``: whole PPO iterations as the train stage runs them
(:func:`stages.training.ppo.ppo_iteration`):
  rollouts through the rsl_rl adapter with the actor sampling every world's action once per
  control step, falls restarted in place, then rsl_rl's update (GAE, 5 epochs x 4
  mini-batches, adaptive learning rate). Collection and update time are both counted.

- ``moving``: the same worlds through the environment under the actions early PPO takes
  (Gaussian noise of the config's initial std), fallen robots restarted in place, with
  observations and rewards but no policy and no learning. Walking and falling robots make
  more contacts than standing ones, so this is what the simulator alone costs for the
  motion the PPO rollouts see.

- ``ppo_pipelined``: the same iterations with ``pipelined: true``
  (:mod:`stages.training.pipelined_ppo`): each update runs on a thread of its own while the next
  rollout is collected with the parameters of one update ago, all of torch on one thread.
  Its collection and update seconds overlap, so they add up to more than an iteration.

``raw_cores_busy`` and ``ppo_cores_busy`` are the cores each kept busy on average (CPU
seconds of every thread over wall seconds): where both are near the machine's core count, no
overlap of collection and update can win more than the CPU work it saves.

The runs alternate ``--repeat`` times; ``ratio_ppo_over_raw`` (target >= 0.5: the learning
overhead at most 2x) and ``ratio_ppo_over_moving`` are medians of the per-round ratios, so a
burst of other load hits both sides of a round. The line also gives the split between
collection and update and the load average before and after.

With ``--device cuda`` the actor, critic and update run on the GPU and the worlds on the CPU
(``scripts/gpu_check.sh`` runs it so when a GPU is lent): the split of an iteration between
collection and update shows how much an update beside the next collection can hide, and
``ratio_ppo_pipelined_over_ppo`` how much the pipelined iterations do hide.

    python benchmarks/train_throughput.py [--worlds 1024] [--iterations 5] [--repeat 3]
        [--device cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN_SCENE = ROOT / "sim_scenes" / "locomotion" / "train.yaml"


def cpu_seconds() -> float:
    """CPU seconds this process has used so far, every thread's, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raw_rate(worlds: int, control_steps: int) -> tuple[float, float]:
    """Control steps/s of the randomized worlds stepped by the batch alone, and the cores
    it kept busy on average (CPU seconds over wall seconds)."""
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.locomotion import LocomotionEnv

    env = LocomotionEnv(load_scene(TRAIN_SCENE), worlds, 0)
    env.reset()
    batch, frame_skip = env.batch, env.frame_skip
    start, cpu = time.perf_counter(), cpu_seconds()
    for _ in range(control_steps):
        batch.step(nstep=frame_skip)
    seconds = time.perf_counter() - start
    return worlds * control_steps / seconds, (cpu_seconds() - cpu) / seconds


def moving_rate(worlds: int, control_steps: int, noise_std: float) -> float:
    """Control steps/s of the same worlds under the actions early PPO takes (Gaussian noise of
    the initial std around the standing pose), fallen robots restarted in place: the
    simulator's cost for walking and falling robots, with its observation and reward, but no
    policy and no learning."""
    import numpy as np

    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.locomotion import LocomotionEnv

    env = LocomotionEnv(load_scene(TRAIN_SCENE), worlds, 0)
    rng = np.random.default_rng(0)
    env.reset()
    done = 0
    start = time.perf_counter()
    while done < control_steps:
        actions = rng.normal(0.0, noise_std, size=(worlds, env.act_dim))
        _, _, over = env.step(actions, restart_fallen=True)
        done += 1
        if over.all():
            env.reset()
    return worlds * control_steps / (time.perf_counter() - start)


class Trainer:
    """The train stage's PPO, built once; :meth:`rate` times whole iterations."""

    def __init__(self, worlds: int, device: str = "cpu", pipelined: bool = False) -> None:
        from rsl_rl.algorithms import PPO

        from stages.sections.models import PPOConfig
        from stages.sim.suites.loading import load_scene
        from stages.sim.tasks.locomotion import LocomotionEnv
        from stages.training import ppo
        from stages.training.rl_env import RslRlEnv

        cfg = yaml_config()
        self.cfg = PPOConfig(**{**cfg, "num_worlds": worlds, "pipelined": pipelined})
        self.venv = RslRlEnv(LocomotionEnv(load_scene(TRAIN_SCENE), worlds, 0), device)
        rsl_cfg = ppo.rsl_rl_config(self.cfg, ppo.DistInfo(0, 0, 1, device))
        with contextlib.redirect_stdout(io.StringIO()):
            self.alg = PPO.construct_algorithm(self.venv.get_observations(), self.venv,
                                               rsl_cfg, device)
        self.alg.train_mode()
        self.obs = self.venv.get_observations()
        self.pipe = None
        if pipelined:
            from stages.training.pipelined_ppo import PipelinedPPO

            self.pipe = PipelinedPPO(self.alg, self.venv, rsl_cfg, device, 0)
        self.done = 0

    def rate(self, iterations: int) -> tuple[float, float, float, float]:
        """Control steps/s over ``iterations`` iterations, seconds of collection and of
        update per iteration, and the cores the iterations kept busy on average."""
        from stages.training.ppo import pipelined_iteration, ppo_iteration

        collect = learn = 0.0
        start, cpu = time.perf_counter(), cpu_seconds()
        for _ in range(iterations):
            if self.pipe is None:
                self.obs, _, c, u = ppo_iteration(self.alg, self.venv, self.obs,
                                                  self.cfg.steps_per_iteration,
                                                  self.cfg.update_threads)
            else:
                self.obs, _, c, u = pipelined_iteration(self.pipe, self.obs, self.cfg,
                                                        self.done)
            collect, learn, self.done = collect + c, learn + u, self.done + 1
        seconds = time.perf_counter() - start
        steps = iterations * self.cfg.steps_per_iteration * self.venv.num_envs
        busy = (cpu_seconds() - cpu) / seconds
        return steps / seconds, collect / iterations, learn / iterations, busy


def yaml_config() -> dict[str, object]:
    """The train section of ``configs/locomotion.yaml`` (scene and resources left out)."""
    import yaml

    data = yaml.safe_load((ROOT / "configs" / "locomotion.yaml").read_text())["train"]
    return {k: v for k, v in data.items() if k not in ("resources",)}


def main() -> None:
    """Measure raw and PPO rates; print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu",
                        help="where the actor, critic and update run (cpu, cuda); the "
                        "simulation stays on the CPU")
    args = parser.parse_args()

    load_before = os.getloadavg()
    trainer = Trainer(args.worlds, args.device)
    trainer.rate(1)  # warm-up: first allocations, normalizer start
    pipelined = Trainer(args.worlds, args.device, pipelined=True)
    pipelined.rate(2)  # warm-up, and the first rollout, which nothing overlaps
    steps = trainer.cfg.steps_per_iteration * args.iterations
    raws, movings, ppos, collects, learns = [], [], [], [], []
    raw_busy, ppo_busy = [], []
    pipes, pipe_busy, pipe_collects, pipe_learns = [], [], [], []
    for _ in range(args.repeat):
        rate, busy = raw_rate(args.worlds, steps)
        raws.append(rate)
        raw_busy.append(busy)
        movings.append(moving_rate(args.worlds, steps, trainer.cfg.init_noise_std))
        rate, collect, learn, busy = trainer.rate(args.iterations)
        ppos.append(rate)
        ppo_busy.append(busy)
        rate, collect_p, learn_p, busy = pipelined.rate(args.iterations)
        pipes.append(rate)
        pipe_busy.append(busy)
        pipe_collects.append(collect_p)
        pipe_learns.append(learn_p)
        collects.append(collect)
        learns.append(learn)
    ratios = [p / r for p, r in zip(ppos, raws, strict=True)]
    ratios_moving = [p / r for p, r in zip(ppos, movings, strict=True)]
    print(json.dumps({
        "benchmark": "train_throughput",
        "task": "locomotion-v0",
        "scene": str(TRAIN_SCENE.relative_to(ROOT)),
        "worlds": args.worlds,
        "steps_per_iteration": trainer.cfg.steps_per_iteration,
        "iterations_per_measurement": args.iterations,
        "raw_control_steps_per_s": round(statistics.median(raws)),
        "moving_control_steps_per_s": round(statistics.median(movings)),
        "ppo_control_steps_per_s": round(statistics.median(ppos)),
        "ppo_collect_s_per_iteration": round(statistics.median(collects), 3),
        "ppo_update_s_per_iteration": round(statistics.median(learns), 3),
        "update_threads": trainer.cfg.update_threads,
        "raw_cores_busy": round(statistics.median(raw_busy), 2),
        "ppo_cores_busy": round(statistics.median(ppo_busy), 2),
        "ratio_ppo_over_raw": round(statistics.median(ratios), 3),
        "ratio_ppo_over_moving": round(statistics.median(ratios_moving), 3),
        "ppo_pipelined_control_steps_per_s": round(statistics.median(pipes)),
        "ppo_pipelined_collect_s_per_iteration": round(statistics.median(pipe_collects), 3),
        "ppo_pipelined_update_s_per_iteration": round(statistics.median(pipe_learns), 3),
        "ppo_pipelined_cores_busy": round(statistics.median(pipe_busy), 2),
        "ratio_ppo_pipelined_over_raw": round(statistics.median(
            p / r for p, r in zip(pipes, raws, strict=True)), 3),
        "ratio_ppo_pipelined_over_ppo": round(statistics.median(
            p / q for p, q in zip(pipes, ppos, strict=True)), 3),
        "target_ratio": 0.5,
        "target_ratio_issue_26": 0.6,
        "device": args.device,
        "cpu_count": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }))


if __name__ == "__main__":
    main()
