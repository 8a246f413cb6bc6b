"""Vision validation throughput on reach-vision-v0: tiled cameras against one world at a time,
in episodes per second, and where the time goes.

One scene of ``configs/reach_vision.yaml``'s validation suite (``nominal``: its episode count,
seed and 100-step episodes) is validated as the validate stage validates a scene unfilmed:
:func:`stages.sim.backends.catalog.make_backend_env` builds the worlds (one per episode),
:func:`stages.evaluation.suite.evaluate_scene` runs the episode with the policy in the loop, and the
environment is closed. The policy is the pipeline's vision policy (:class:`stages.policies.vision.
VisionPolicy` with the config's ``train.hidden`` and ``encoder_channels``; seeded, untrained
weights: the episode length is fixed, so what it does changes no time), wrapped as the
validate stage wraps it (:func:`stages.policies.local.policy_fn`, one torch thread). Each run sets
``PHYSAI_CAMERA_TILES`` as a user would:

- ``tiled``: ``auto``, the tiles spread over worker processes (``tiled_processes``), the
  workers' start-up inside the clock;
- ``in_process``: ``on``, every tile in this process;
- ``one_at_a_time``: ``off``, a ``mujoco.Renderer`` frame per world, the baseline.

The three alternate ``--repeat`` times; ``ratio_tiled_over_one_at_a_time`` (target >= 1.8) and
``ratio_in_process_over_one_at_a_time`` are medians of the per-triple ratios of episodes per
second, so a burst of other load hits every side of a triple. ``same_outcomes`` says whether
every run gave every world the same success and return. For each side, the median run's wall
time is split into ``render`` (``camera_images``: painting, drawing, readback, image noise),
``physics`` (``step``: the control step of every world and the task's terms), ``policy`` (the
policy call) and ``other`` (building and closing the worlds, observations, records), in seconds
and as shares. ``load_avg_1m`` before and after shows whether other work shared the CPUs.
Needs offscreen OpenGL: ``MUJOCO_GL=egl`` (set here unless the environment sets it).

``--overlap-groups G`` (default: the config's ``validate.overlap_groups``) splits the worlds
into G groups as the validate stage does, each rendering its cameras and stepping on a thread
of its own while another group's policy runs (:mod:`stages.sim.env.overlap`); the parts' seconds
are then summed over the groups' threads, so their shares can add up to more than 1.

    MUJOCO_GL=egl python benchmarks/vision_validation.py [--repeat 3] [--episodes N]
        [--overlap-groups G]
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
import yaml

os.environ.setdefault("MUJOCO_GL", "egl")

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "reach_vision.yaml"
SCENE = "nominal"
MODES = {"tiled": "auto", "in_process": "on", "one_at_a_time": "off"}
"""Each measured side and the ``PHYSAI_CAMERA_TILES`` it runs with."""


def _timed(fn: Callable[..., Any], spent: dict[str, float], part: str) -> Callable[..., Any]:
    """``fn``, adding the seconds of each call to ``spent[part]``."""

    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - start

    return run


class TimedPolicy:
    """A policy whose calls add their seconds to ``spent["policy"]``; it reads what the policy
    reads (its ``inputs``, its chunks)."""

    def __init__(self, act: Any, spent: dict[str, float]) -> None:
        self._act, self._spent = act, spent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._act, name)

    def __call__(self, observation: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._act(observation)
        finally:
            self._spent["policy"] += time.perf_counter() - start


def make_policy() -> Any:
    """The config's vision policy, seeded and untrained, as the validate stage calls it."""
    import torch

    from stages.policies.local import policy_fn
    from stages.policies.vision import build_vision_policy, image_shape
    from stages.sim.env.cameras import image_shapes
    from stages.sim.tasks.catalog import get_task

    train = yaml.safe_load(CONFIG.read_text())["train"]
    spec = get_task("reach-vision-v0")
    torch.manual_seed(0)
    cameras = [(key, image_shape(shape)) for key, (shape, _) in image_shapes(spec.cameras).items()]
    module = build_vision_policy(spec.obs_dim, spec.act_dim, train["hidden"], cameras,
                                 np.zeros(spec.obs_dim), np.ones(spec.obs_dim),
                                 train["encoder_channels"])
    return policy_fn(module.eval())


def validate_once(mode: str, act: Any, episodes: int | None, groups: int) -> dict[str, Any]:
    """One unfilmed validation of the nominal scene with cameras rendering as ``mode`` says
    (``PHYSAI_CAMERA_TILES``), its worlds in ``groups`` overlapped groups as the validate
    stage splits them (:func:`stages.sim.env.overlap.grouped_env`): episodes per second, the
    split of its time, the outcomes."""
    from stages.evaluation.suite import evaluate_scene
    from stages.sim.backends.catalog import make_backend_env
    from stages.sim.env.overlap import grouped_env
    from stages.sim.env.tiled import TILES_ENV
    from stages.sim.suites.loading import load_suite
    from stages.sim.tasks.catalog import get_task

    suite = load_suite(CONFIG.parent / yaml.safe_load(CONFIG.read_text())["validate"]["suite"])
    scene, count, seed = next(s for s in suite.scenes if s.scene.config.name == SCENE)
    n = episodes or count
    os.environ[TILES_ENV] = mode
    spent = dict.fromkeys(("render", "physics", "policy"), 0.0)

    def timed_env(worlds: int, group_seed: int, threads: int | None) -> Any:
        env: Any = make_backend_env(suite.config.backend, get_task(suite.config.task), scene,
                                    worlds, group_seed, num_threads=threads)
        env.camera_images = _timed(env.camera_images, spent, "render")
        env.step = _timed(env.step, spent, "physics")
        return env

    start = time.perf_counter()
    env = grouped_env(timed_env, n, seed, min(groups, n))
    try:
        result, out = evaluate_scene(env, TimedPolicy(act, spent), SCENE, n)
    finally:
        env.close()
    wall = time.perf_counter() - start
    spent["other"] = max(0.0, wall - sum(spent.values()))
    return {"episodes_per_s": n / wall, "wall_s": wall, "spent": spent, "episodes": n,
            "steps": scene.config.episode_steps, "success": out.success.copy(),
            "returns": out.returns.copy(), "success_rate": result.success_rate}


def split(run: dict[str, Any]) -> dict[str, Any]:
    """Seconds and shares of a run's time by part."""
    wall = run["wall_s"]
    return {part: {"s": round(s, 2), "share": round(s / wall, 3)}
            for part, s in run["spent"].items()}


def main() -> None:
    """Run the three sides in alternating triples; print the JSON line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=None,
                        help="episodes (worlds) of the scene; default: the suite's count")
    parser.add_argument("--overlap-groups", type=int, default=None,
                        help="groups of worlds rendered and stepped beside each other; "
                        "default: the config's validate.overlap_groups")
    args = parser.parse_args()
    groups = args.overlap_groups or int(
        yaml.safe_load(CONFIG.read_text())["validate"].get("overlap_groups", 1))

    from stages.sim.env.tiled import TILES_ENV, tile_processes

    act = make_policy()
    load_before = os.getloadavg()
    validate_once("on", act, 2, 1)  # imports and the first OpenGL context, outside every run
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in MODES}
    for _ in range(args.repeat):
        for side, mode in MODES.items():
            runs[side].append(validate_once(mode, act, args.episodes, groups))
    os.environ.pop(TILES_ENV, None)
    base = runs["one_at_a_time"]

    def ratio(side: str) -> float:
        return statistics.median(r["episodes_per_s"] / b["episodes_per_s"]
                                 for r, b in zip(runs[side], base, strict=True))

    def median_run(side: str) -> dict[str, Any]:
        ordered = sorted(runs[side], key=lambda r: r["episodes_per_s"])
        return ordered[len(ordered) // 2]

    first = base[0]
    same = all(np.array_equal(r["success"], first["success"])
               and np.array_equal(r["returns"], first["returns"])
               for side in MODES for r in runs[side])
    print(json.dumps({
        "benchmark": "vision_validation",
        "task": "reach-vision-v0",
        "scene": SCENE,
        "episodes": first["episodes"],
        "steps": first["steps"],
        "image": "64x64 rgb",
        "mujoco_gl": os.environ.get("MUJOCO_GL"),
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "overlap_groups": groups,
        "tiled_processes": tile_processes(first["episodes"] // groups, "auto"),
        **{f"{side}_episodes_per_s": round(statistics.median(
            r["episodes_per_s"] for r in runs[side]), 3) for side in MODES},
        "ratio_tiled_over_one_at_a_time": round(ratio("tiled"), 3),
        "ratio_in_process_over_one_at_a_time": round(ratio("in_process"), 3),
        "target_tiled_over_one_at_a_time_min": 1.8,
        "same_outcomes": same,
        "success_rate": first["success_rate"],
        **{f"{side}_time": split(median_run(side)) for side in MODES},
        **{f"{side}_runs": [round(r["episodes_per_s"], 3) for r in runs[side]]
           for side in MODES},
        "load_avg_1m_before": round(load_before[0], 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
