"""A diffusion policy trained by LeRobot itself (tiny, on the CPU, from random weights, nothing
downloaded) enters the project as ``train: {source: FOLDER}`` does, and the ONNX policy it is
stored as, run as validation runs it (ONNX Runtime; its history of ``n_obs_steps``, its noise
and its scheduler's steps kept by edge.runtime.DiffusionSampler; ``n_action_steps`` of each
chunk by edge.runtime.ActionChunks), acts as LeRobot's own ``select_action`` through its
processors on the same observations when both are given the same noise: DDPM (noise at every
step) and DDIM, predicting the noise and the sample.

The project's side runs in the project's interpreter (tests/fixtures/lerobot_diffusion_project.py);
the reference here is computed in this process by LeRobot and diffusers alone, its noise drawn
from the generator the graph's metadata names, one block (W, steps + 1, horizon, act_dim) a
query: the initial sample through ``select_action``'s ``noise``, each DDPM step's through
diffusers' ``randn_tensor``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import diffusers.schedulers.scheduling_ddpm as ddpm
import numpy as np
import pytest
import torch
from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
from lerobot.policies.factory import make_pre_post_processors

from tests.fixtures.lerobot_diffusion import train_tiny_diffusion

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4
"""Max |ONNX + sampler + ActionChunks - LeRobot select_action| over every step and world, whole
action sequences (float32 graphs of the same network, the scheduler's arithmetic in float64
then float32; seen: about 3e-6 on actions of size ~2)."""
STEPS, WORLDS = 14, 2


def lerobot_actions(folder: Path, probes: dict[str, np.ndarray], seed: int) -> np.ndarray:
    """LeRobot's ``select_action`` step by step from a reset, through the policy's saved
    preprocessor and postprocessor, each query fed the next noise block. Shape: (T, W, A)."""
    policy = DiffusionPolicy.from_pretrained(str(folder), local_files_only=True)
    policy.eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(folder))
    config = policy.config
    steps = policy.diffusion.num_inference_steps
    rng = np.random.Generator(np.random.PCG64(seed))
    pending: list[torch.Tensor] = []
    original = ddpm.randn_tensor

    def step_noise(shape: Any, **_: Any) -> torch.Tensor:
        return pending.pop(0)

    policy.reset()
    out = []
    ddpm.randn_tensor = step_noise
    try:
        with torch.no_grad():
            for t in range(len(probes["obs"])):
                image = torch.from_numpy(probes["front_image"][t]).permute(0, 3, 1, 2) / 255.0
                batch = pre({"observation.state": torch.from_numpy(probes["obs"][t]),
                             "observation.images.front": image})
                noise = None
                if not policy._queues["action"]:  # this step queries
                    block = torch.from_numpy(rng.standard_normal(
                        (WORLDS, steps + 1, config.horizon, 7), dtype=np.float32))
                    noise, pending[:] = block[:, 0], list(block[:, 1:].unbind(1))
                out.append(post(policy.select_action(batch, noise=noise)).numpy())
    finally:
        ddpm.randn_tensor = original
    return np.stack(out)


@pytest.mark.parametrize(("scheduler", "prediction"), [
    ("DDPM", "epsilon"), ("DDIM", "sample"),
])
def test_the_stored_diffusion_policy_acts_as_lerobots_select_action(
    tmp_path: Path, project_python: Path, scheduler: str, prediction: str,
) -> None:
    folder = train_tiny_diffusion(tmp_path / "diffusion" / "pretrained_model",
                                  scheduler=scheduler, prediction=prediction)
    rng = np.random.default_rng(3)
    probes = {"obs": rng.standard_normal((STEPS, WORLDS, 17)).astype(np.float32),
              "front_image": rng.integers(0, 256, (STEPS, WORLDS, 64, 64, 3), dtype=np.uint8)}
    np.savez(tmp_path / "probes.npz", **probes)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PHYSAI_HOME": str(tmp_path / "physai"),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [str(project_python), str(ROOT / "tests/fixtures/lerobot_diffusion_project.py"),
         str(tmp_path / "diffusion"), str(tmp_path / "probes.npz"), str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["kind"] == "lerobot" and report["chunk"] == {"size": 4, "execute": 4}
    assert report["history"] == 2 and report["diffusion"]["steps"] == 10
    assert report["diffusion"]["noise"] == {"generator": "numpy.random.PCG64", "seed": 0}
    assert report["parity_max_abs_diff"] <= TOLERANCE  # the import's own check, on its probes
    arrays = np.load(tmp_path / "out" / "actions.npz")
    ours, broken = arrays["actions"], arrays["broken"]
    theirs = lerobot_actions(folder, probes, report["diffusion"]["noise"]["seed"])
    assert ours.shape == theirs.shape == (STEPS, WORLDS, 7)
    diff = float(np.abs(ours - theirs).max())
    assert diff <= TOLERANCE, diff
    # the oracle can fail: a scheduler whose timesteps are off by one, other noise, another
    # world's observations all give other actions
    assert np.abs(broken - theirs).max() > 100 * TOLERANCE
    assert np.abs(ours - lerobot_actions(folder, probes, 1)).max() > 100 * TOLERANCE
    assert np.abs(ours[:, ::-1] - theirs).max() > 100 * TOLERANCE
    latency = report["latency_ms_p50"]
    print(f"\ndiffusion {scheduler}/{prediction}: max |ONNX - select_action| {diff:.2g} over "
          f"{STEPS} steps (broken timesteps: {np.abs(broken - theirs).max():.2g}); ONNX "
          f"Runtime per query p50 {latency['10']:.2f} ms at 10 steps, {latency['5']:.2f} ms "
          f"at 5; LeRobot per query p50 {report['metrics']['lerobot_latency_ms_p50']:.1f} ms")
