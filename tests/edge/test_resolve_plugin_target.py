"""An edge target a plugin registers through the ``physai_flows.targets`` entry point is seen
where targets are resolved: the registry and ``flows bundle verify`` of a bundle made for it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

NX = dict(name="jetson-orin-nx", device="Jetson Orin NX 16GB", jetpack="6.2", l4t="36.4",
          cuda="12.6", tensorrt="10.3", gpu_arch="sm_87", max_onnx_opset=20,
          precisions=("fp32", "fp16", "int8"),
          container_base="nvcr.io/nvidia/l4t-jetpack:r36.4.0")
"""The plugin's target, as docs/extending.md writes it."""


def _target_plugin(site: Path) -> None:
    """An installed distribution (dist-info on the path) whose entry point registers NX."""
    info = site / "my_jetson-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-jetson\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[physai_flows.targets]\nmy-orin-nx = my_jetson:register\n")
    (site / "my_jetson.py").write_text(
        "from edge.targets import EdgeTarget, register_target\n\n\n"
        f"def register():\n    register_target(EdgeTarget(**{NX!r}))\n")


def _run(site: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    path = [str(site)] if site is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)]), "COLUMNS": "200"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_target_registry_loads_a_plugins_target(tmp_path: Path) -> None:
    _target_plugin(tmp_path / "site")
    done = _run(tmp_path / "site", "-c", "from edge.targets import get_target, target_names\n"
                "print(get_target('jetson-orin-nx').gpu_arch, *target_names())")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["sm_87", "jetson-agx-orin", "jetson-agx-thor",
                                   "jetson-orin-nx"]


def test_bundle_verify_sees_a_plugins_target(
    tmp_path: Path, onnx_path: Path, dataset_obs: np.ndarray, manifest_fields: dict[str, object]
) -> None:
    from edge.calibration import draw_calibration_set
    from edge.pack import pack_policy_bundle
    from edge.targets import EdgeTarget

    target = EdgeTarget(**NX)  # type: ignore[arg-type]
    bundle = tmp_path / "nx.tar"
    pack_policy_bundle(bundle, onnx_path, draw_calibration_set(dataset_obs, 64), "dataset",
                       {**manifest_fields, "target": dataclasses.asdict(target)}, target)
    _target_plugin(tmp_path / "site")
    done = _run(tmp_path / "site", "-m", "flows.cli", "bundle", "verify", str(bundle),
                "--allow-unsigned")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "target jetson-orin-nx (JetPack 6.2" in done.stdout
    alone = _run(None, "-m", "flows.cli", "bundle", "verify", str(bundle))
    assert alone.returncode == 2, alone.stdout[-2000:] + alone.stderr[-2000:]
    assert "unknown edge target 'jetson-orin-nx'; valid: jetson-agx-orin, jetson-agx-thor" in (
        alone.stderr)


def test_a_plugin_reusing_a_shipped_name_is_refused_in_one_line(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _target_plugin(site)
    text = (site / "my_jetson.py").read_text().replace("'jetson-orin-nx'", "'jetson-agx-orin'")
    (site / "my_jetson.py").write_text(text)
    done = _run(site, "-m", "flows.cli", "plugins")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "flows: error: plugin entry point physai_flows.targets:my-orin-nx = my_jetson:register "
        "(my-jetson 0.1.0) failed to load: EdgeError: edge target 'jetson-agx-orin' is already "
        "registered"]
