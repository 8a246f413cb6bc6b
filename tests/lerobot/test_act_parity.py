"""An ACT policy trained by LeRobot itself (tiny, on the CPU, from random weights, nothing
downloaded) enters the project as ``train: {source: FOLDER}`` does, and the ONNX policy it is
stored as, run as validation runs a chunk policy (ONNX Runtime, edge.runtime.ActionChunks),
acts as LeRobot's own ``select_action`` through its processors on the same observations:
the action queue of ``n_action_steps`` and temporal ensembling both.

The project's side runs in the project's interpreter (tests/fixtures/lerobot_act_project.py);
the reference here is computed in this process by LeRobot alone.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors

from tests.fixtures.lerobot_act import train_tiny_act

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4
"""Max |ONNX + ActionChunks - LeRobot select_action| over every step and world (float32 graphs
of the same network; seen: about 2e-7 on actions of size ~0.4)."""
STEPS, WORLDS = 23, 2


def lerobot_actions(folder: Path, probes: dict[str, np.ndarray]) -> np.ndarray:
    """LeRobot's ``select_action`` step by step from a reset, through the policy's saved
    preprocessor and postprocessor, images fed as LeRobot's environments feed them (float
    CHW in [0, 1]). Shape: (T, W, act_dim)."""
    policy = ACTPolicy.from_pretrained(str(folder), local_files_only=True)
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(folder))
    policy.reset()
    out = []
    with torch.no_grad():
        for t in range(len(probes["obs"])):
            image = torch.from_numpy(probes["front_image"][t]).permute(0, 3, 1, 2) / 255.0
            batch = pre({"observation.state": torch.from_numpy(probes["obs"][t]),
                         "observation.images.front": image})
            out.append(post(policy.select_action(batch)).numpy())
    return np.stack(out)


@pytest.mark.parametrize(("mode", "chunk"), [
    ({"execute": 4}, {"size": 10, "execute": 4}),
    ({"ensemble": 0.01}, {"size": 10, "ensemble": 0.01}),
])
def test_the_stored_act_policy_acts_as_lerobots_select_action(
    tmp_path: Path, project_python: Path, mode: dict[str, float], chunk: dict[str, float],
) -> None:
    folder = train_tiny_act(tmp_path / "act" / "pretrained_model", **mode)
    rng = np.random.default_rng(3)
    probes = {"obs": rng.standard_normal((STEPS, WORLDS, 17)).astype(np.float32),
              "front_image": rng.integers(0, 256, (STEPS, WORLDS, 64, 64, 3), dtype=np.uint8)}
    np.savez(tmp_path / "probes.npz", **probes)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PHYSAI_HOME": str(tmp_path / "physai")}
    done = subprocess.run(
        [str(project_python), str(ROOT / "tests/fixtures/lerobot_act_project.py"),
         str(tmp_path / "act"), str(tmp_path / "probes.npz"), str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["kind"] == "lerobot" and report["chunk"] == chunk
    assert report["chunk_size"] == 10
    assert report["parity_max_abs_diff"] <= 1e-5  # the import's own check, on its probes
    ours = np.load(tmp_path / "out" / "actions.npz")["actions"]
    theirs = lerobot_actions(folder, probes)
    assert ours.shape == theirs.shape == (STEPS, WORLDS, 7)
    diff = float(np.abs(ours - theirs).max())
    assert diff <= TOLERANCE, diff
    # the oracle can fail: another world's observations give other actions
    assert np.abs(ours[:, ::-1] - theirs).max() > 100 * TOLERANCE
    print(f"\nACT {chunk}: max |ONNX - select_action| {diff:.2g}; ONNX Runtime per query "
          f"p50 {report['onnx_latency_us_p50'] / 1e3:.2f} ms, p99 "
          f"{report['onnx_latency_us_p99'] / 1e3:.2f} ms; LeRobot per query p50 "
          f"{report['metrics']['lerobot_latency_ms_p50']:.1f} ms")
