"""Cost of validating on Isaac Lab through the pipeline: its rollout against a plain Isaac Lab loop.

Both sides step the same Isaac Lab scene (reach-v0's arm on Newton's MuJoCo-Warp solver, CPU,
``--worlds`` worlds of ``sim_scenes/reach/nominal.yaml``, one episode of its control steps) with
the same fixed linear policy on the 23 observations, in one process, in ``--repeat`` pairs
(which side goes first alternates):

- ``pipeline``: :func:`stages.evaluation.rollout.rollout` over
  :class:`stages.sim.backends.isaaclab_robot.IsaacLabReachEnv`, as the validate stage runs a scene:
  action clipping and servo targets, observations, rewards, fixed-length episodes and the
  success predicate.
- ``plain``: Isaac Lab's own scene and articulation driven by a bare loop: write the servo
  targets, ``sim.step``, ``scene.update``, read joint state and the end effector's link pose,
  build the same observation and call the same policy.

``ratio`` (target >= 0.8) is the median over pairs of plain seconds / pipeline seconds: 1.0
means the pipeline costs nothing. Isaac Lab lives in the ``isaaclab`` stage environment
(``make isaaclab``); run from the project's own venv, this script runs itself there. Prints
one JSON line.

    python benchmarks/isaaclab_validation.py [--worlds 256] [--repeat 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCENE = ROOT / "sim_scenes" / "reach" / "nominal.yaml"


def _policy(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed linear policy ``a = tanh(obs @ W + b)``: weights and bias."""
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 0.05, size=(23, 7)), rng.normal(0.0, 0.05, size=7)


def pipeline_seconds(env: Any, weights: np.ndarray, bias: np.ndarray) -> tuple[float, float]:
    """Seconds of one validation rollout of ``env`` through the pipeline, and its success."""
    from stages.evaluation.rollout import rollout

    def act(obs: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.tanh(obs @ weights + bias).astype(np.float32)
        return out

    start = time.perf_counter()
    out = rollout(env, act)
    return time.perf_counter() - start, float(out.success.mean())


def plain_seconds(env: Any, weights: np.ndarray, bias: np.ndarray) -> float:
    """Seconds of the same episode on the same Isaac Lab scene, stepped by a bare loop."""
    from stages.sim.tasks import reach
    torch, device = env._torch, env._device
    arm, sim, scene, p = env._arm, env._sim, env._scene, env._p
    origins = torch.as_tensor(env._origins, dtype=torch.float32, device=device)
    offset = torch.as_tensor(p.ee_offset, dtype=torch.float32, device=device)
    w = torch.as_tensor(weights, dtype=torch.float32, device=device)
    b = torch.as_tensor(bias, dtype=torch.float32, device=device)
    low = torch.as_tensor(p.ctrl_low, dtype=torch.float32, device=device)
    high = torch.as_tensor(p.ctrl_high, dtype=torch.float32, device=device)
    ee_body = p.ee_body
    env.reset()  # the same initial states and targets the pipeline's episode starts from
    target = torch.as_tensor(env._target, dtype=torch.float32, device=device)
    ctrl = torch.as_tensor(env._ctrl, dtype=torch.float32, device=device)
    dt = 1.0 / reach.CONTROL_HZ
    start = time.perf_counter()
    for _ in range(env.episode_steps):
        data = arm.data
        pos = data.body_link_pos_w.torch[:, ee_body] - origins
        x, y, z, qw = data.body_link_quat_w.torch[:, ee_body].unbind(-1)
        rot = torch.stack([
            torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * qw), 2 * (x * z + y * qw)], -1),
            torch.stack([2 * (x * y + z * qw), 1 - 2 * (x * x + z * z), 2 * (y * z - x * qw)], -1),
            torch.stack([2 * (x * z - y * qw), 2 * (y * z + x * qw), 1 - 2 * (x * x + y * y)], -1),
        ], -2)
        ee = pos + rot @ offset
        obs = torch.cat([data.joint_pos.torch, data.joint_vel.torch, ee, target, target - ee], 1)
        action = torch.tanh(obs @ w + b).clamp(-1.0, 1.0)
        ctrl = torch.minimum(torch.maximum(ctrl + reach.ACTION_SCALE * action, low), high)
        arm.actuators.target_command.set_position_index(value=ctrl)
        scene.write_data_to_sim()
        sim.step(render=False)
        scene.update(dt)
    return time.perf_counter() - start


def main() -> None:
    """Run both sides in pairs and print the JSON line (in the isaaclab environment)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                        help="where Isaac Lab simulates (auto: a CUDA GPU when there is one)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from stages.core.environments import require_python, runs_here

    if not runs_here("isaaclab"):
        python = require_python("isaaclab", "benchmarks/isaaclab_validation.py")
        variables = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        os.execve(python, [str(python), __file__, *sys.argv[1:]], variables)
    import importlib.metadata as metadata

    from stages.sim.backends.isaaclab_robot import IsaacLabReachEnv
    from stages.sim.suites.loading import load_scene

    weights, bias = _policy()
    env = IsaacLabReachEnv(load_scene(SCENE), args.worlds, 0, device=args.device)
    pipeline_seconds(env, weights, bias)  # Warp kernels compiled, caches warm
    pipe, plain, ratios = [], [], []
    success = 0.0
    for i in range(args.repeat):
        if i % 2:
            b = plain_seconds(env, weights, bias)
            p, success = pipeline_seconds(env, weights, bias)
        else:
            p, success = pipeline_seconds(env, weights, bias)
            b = plain_seconds(env, weights, bias)
        pipe.append(p)
        plain.append(b)
        ratios.append(b / p)
    steps, device = env.episode_steps, env._device
    env.close()
    world_steps = args.worlds * steps
    print(json.dumps({
        "benchmark": "isaaclab_validation",
        "task": "reach-v0",
        "device": device,
        "worlds": args.worlds,
        "steps": steps,
        "repeat": args.repeat,
        "isaaclab": metadata.version("isaaclab"),
        "newton": metadata.version("newton"),
        "pipeline_world_steps_per_s": round(world_steps / statistics.median(pipe)),
        "plain_world_steps_per_s": round(world_steps / statistics.median(plain)),
        "ratio": round(statistics.median(ratios), 3),
        "target_ratio_min": 0.8,
        "success_pipeline": success,
        "load_avg": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
