"""A diffusion policy trained by LeRobot itself (tiny, on the CPU, from random weights, nothing
downloaded) through the whole pipeline and onto the robot: ``train: {source: FOLDER}`` exports
it in the lerobot stage environment (its denoising loop in the graph, its noise and scheduler
steps inputs) and checks it against LeRobot's ``select_action`` under the same noise; it is
validated on reach-vision-v0's tiny suite with its history of observations, packaged with its
sampling (``io.diffusion``: history, scheduler, seeded noise, the package's denoising steps,
which the latency gate times) and its chunks of ``n_action_steps``, promoted, and driven by the
edge runtime in ``flows bundle drive``. The gates are opened
(tests/fixtures/lerobot_diffusion_tiny.yaml): an untrained policy almost never reaches; the
path is what is tested."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import CliEnv
from tests.support import stage_python

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

pytestmark = pytest.mark.e2e


def test_a_lerobot_diffusion_policy_is_imported_validated_packaged_promoted_and_driven(
    tmp_path: Path, cli_env: CliEnv
) -> None:
    from mlflow import MlflowClient

    python = stage_python("lerobot")
    trained = subprocess.run(
        [str(python), str(FIXTURES / "lerobot_diffusion.py"), str(tmp_path / "diffusion")],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}, capture_output=True,
        text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    config = yaml.safe_load((FIXTURES / "lerobot_diffusion_tiny.yaml").read_text())
    config["validate"]["suite"] = str(FIXTURES / config["validate"]["suite"])
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    home = tmp_path / ".physai"
    env = cli_env(home)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", "pipeline.yaml"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    promoted = [line for line in done.stdout.splitlines()
                if "models:/lerobot-diffusion-tiny/" in line]
    assert promoted and "models:/lerobot-diffusion-tiny/1 -> @champion" in promoted[0], (
        promoted or done.stdout[-3000:])

    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    version = client.get_model_version_by_alias("lerobot-diffusion-tiny", "champion")
    train = client.get_run(version.tags["physai.train_run_id"])
    assert train.data.params["lerobot_type"] == "diffusion"
    assert train.data.metrics["parity_max_abs_diff"] <= 1e-4
    assert train.data.metrics["parity_chunk_max_abs_diff"] <= 1e-4
    latency = client.get_run(version.tags["physai.package_run_id"]).data.metrics

    bundle = next((home / "store" / "objects").glob(f"*/{version.tags['physai.bundle.digest']}"))
    with tarfile.open(bundle) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("manifest.json"))
        handle = tar.extractfile(member)
        assert handle is not None
        manifest = json.loads(handle.read())
    io = manifest["io"]
    assert io["chunk"] == {"size": 4, "execute": 4}
    assert io["actions"]["shape"] == ["batch", 4, 7]
    assert [image["name"] for image in io["images"]] == ["front_image"]
    sampling = io["diffusion"]
    assert (sampling["n_obs_steps"], sampling["horizon"], sampling["steps"]) == (2, 8, 5)
    assert sampling["noise"] == {"generator": "numpy.random.PCG64", "seed": 0}
    assert sampling["scheduler"]["type"] == "DDPM"
    assert len(sampling["scheduler"]["alphas_cumprod"]) == 100

    verify = subprocess.run([sys.executable, "-m", "flows.cli", "bundle", "verify", str(bundle)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    assert "diffusion: 2 observations a query, 5 denoising steps of a DDPM scheduler, noise " \
        "numpy.random.PCG64 seed 0" in verify.stdout, verify.stdout

    scene = FIXTURES / "reach_vision_scene_tiny.yaml"
    drive = subprocess.run(
        [sys.executable, "-m", "flows.cli", "bundle", "drive", str(bundle), "--scene",
         str(scene), "--episodes", "2", "--rate", "50", "--seed", "5"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert drive.returncode == 0, drive.stdout[-3000:] + drive.stderr[-3000:]
    found = re.search(r"(\d+)/2 = .* (\d+) steps, .*; chunks of 4 \(execute 4\), (\d+) queries",
                      drive.stdout)
    assert found, drive.stdout
    steps, queries = int(found.group(2)), int(found.group(3))
    assert steps == 2 * 12 and queries >= steps // 4, drive.stdout
    print(f"\nLeRobot diffusion: parity {train.data.metrics['parity_max_abs_diff']:.2g}, "
          f"LeRobot per query {train.data.metrics.get('lerobot_latency_ms_p50', 0):.1f} ms; "
          f"package p99 {latency['latency_p99_us'] / 1e3:.1f} ms at 5 steps; drive: "
          f"{drive.stdout.strip()}")
