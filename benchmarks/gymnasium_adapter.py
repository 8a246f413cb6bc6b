"""Cost of the Gymnasium adapter: the pipeline's batched rollout against a plain vector-env loop.

Both sides run the same work in one process, in ``--repeat`` pairs (which side goes first
alternates): ``--worlds`` copies of ``gymnasium:InvertedPendulum-v5`` (the scene
``sim_scenes/pendulum/nominal.yaml``, 1000 control steps) driven by one linear policy,
``a = clip(K @ obs, -3, 3)`` with K = (1, 20, 1, 2), computed once per step for all worlds.

- ``pipeline``: :func:`stages.evaluation.rollout.rollout` over the task's batched environment
  (:class:`stages.sim.backends.gymnasium_env.GymBatchedEnv`), as the validate stage runs it:
  action scaling, fixed-length episodes, ended worlds frozen, returns and the success predicate.
- ``plain``: the same ``gymnasium.vector.SyncVectorEnv`` of the same environments, reset with
  the same seeds and stepped by a bare loop with the same policy.

``ratio`` (target >= 0.9) is the median over pairs of plain seconds / pipeline seconds: 1.0
means the adapter costs nothing. Prints one JSON line.

    python benchmarks/gymnasium_adapter.py [--worlds 16] [--repeat 9]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCENE = ROOT / "sim_scenes" / "pendulum" / "nominal.yaml"
GAINS = np.array([1.0, 20.0, 1.0, 2.0])
"""Gains of the PD policy on (cart position, pole angle, cart velocity, pole velocity)."""
FORCE_LIMIT = 3.0
"""The action Box of InvertedPendulum-v5: [-3, 3]."""


def pipeline_seconds(worlds: int, seed: int) -> tuple[float, float]:
    """Seconds of one validation rollout through the adapter, and its success rate."""
    from stages.evaluation.rollout import rollout
    from stages.sim.suites.loading import load_scene
    from stages.sim.tasks.catalog import get_task

    scene = load_scene(SCENE)
    env = get_task(scene.config.task).make_env(scene, worlds, seed)

    def act(obs: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.clip(obs @ GAINS, -FORCE_LIMIT, FORCE_LIMIT)[:, None] / FORCE_LIMIT
        return out

    start = time.perf_counter()
    out = rollout(env, act)
    seconds = time.perf_counter() - start
    env.close()
    return seconds, float(out.success.mean())


def plain_seconds(worlds: int, seed: int, steps: int) -> tuple[float, float]:
    """Seconds of the same episode in a bare SyncVectorEnv loop, and the share that survived."""
    import gymnasium
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    def make() -> gymnasium.Env:
        return gymnasium.make("InvertedPendulum-v5", max_episode_steps=steps)

    vec = SyncVectorEnv([make] * worlds, autoreset_mode=AutoresetMode.DISABLED)
    seeds: list[int | None] = [
        int(s) for s in np.random.SeedSequence(seed).generate_state(worlds)]
    start = time.perf_counter()
    obs, _ = vec.reset(seed=seeds)
    fell = np.zeros(worlds, bool)
    for _ in range(steps):
        action = np.clip(obs @ GAINS, -FORCE_LIMIT, FORCE_LIMIT)[:, None]
        obs, _, terminated, _, _ = vec.step(action.astype(np.float32))
        fell |= terminated
    seconds = time.perf_counter() - start
    vec.close()
    return seconds, float(1.0 - fell.mean())


def main() -> None:
    """Alternate the two sides and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    from stages.sim.suites.loading import load_scene

    steps = load_scene(SCENE).config.episode_steps
    pipeline_seconds(args.worlds, 0)  # imports, model compilation
    load_before = os.getloadavg()[0]
    pipe, plain, ratios = [], [], []
    for i in range(args.repeat):
        # Alternate which side runs first, so neither always finds the caches the other left.
        if i % 2:
            b, b_success = plain_seconds(args.worlds, i, steps)
            p, p_success = pipeline_seconds(args.worlds, i)
        else:
            p, p_success = pipeline_seconds(args.worlds, i)
            b, b_success = plain_seconds(args.worlds, i, steps)
        pipe.append(p)
        plain.append(b)
        ratios.append(b / p)
    env_steps = args.worlds * steps
    print(json.dumps({
        "benchmark": "gymnasium_adapter",
        "env": "InvertedPendulum-v5",
        "worlds": args.worlds,
        "steps": steps,
        "repeat": args.repeat,
        "pipeline_steps_per_s": round(env_steps / statistics.median(pipe)),
        "plain_steps_per_s": round(env_steps / statistics.median(plain)),
        "ratio": round(statistics.median(ratios), 3),
        "target_ratio_min": 0.9,
        "success_pipeline": p_success,
        "survived_plain": b_success,
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
