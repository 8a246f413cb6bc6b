#!/usr/bin/env bash
# Installs Isaac Lab 3.0.0 (kit-less, Newton on CPU) into a Python 3.11 venv beside the project.
# Isaac Lab declares Python >=3.12 and torch 2.11.0 (CUDA); here it takes the CPU torch 2.13.0 and
# the project's mujoco 4.0.0 in place of newton's mujoco 3.12 pin.
# Usage: scripts/install_isaaclab.sh [VENV]   (default: .venv-isaaclab); then run
#   PYTHONPATH=. VENV/bin/python -m pytest tests/stages/sim/test_sim_isaaclab.py
set -euo pipefail
venv="${1:-.venv-isaaclab}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3.11 -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install -q torch==2.13.0 packaging
"$pip" download -q --no-deps --ignore-requires-python isaaclab==3.0.0 -d "$work"
wheel="$(ls "$work"/isaaclab-3.0.0-*.whl)"
"$venv/bin/python" - "$wheel" > "$work/requirements.txt" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = z.read("isaaclab-3.0.0.dist-info/METADATA").decode()
for line in meta.splitlines():
    if line.startswith("Requires-Dist: "):
        req = Requirement(line.removeprefix("Requires-Dist: "))
        if req.name in {"torch", "torchvision", "open3d"} or "extra" in str(req.marker or ""):
            continue
        print(req)
PY
echo "torch==2.13.0" > "$work/constraints.txt"
"$pip" install -q -r "$work/requirements.txt" -c "$work/constraints.txt"
"$pip" install -q --no-deps --ignore-requires-python "$wheel"
# newton brings the monolithic mujoco 3.12; remove it before the split 4.0 packages go in, or
# its uninstall deletes files mujoco-core just wrote.
"$pip" uninstall -q -y mujoco
"$pip" install -q --no-deps mujoco==4.0.0 mujoco-core==4.0.0 mujoco-studio==4.0.0
# What the project's stages need there beside Isaac Lab: MLflow for a training stage's lineage
# (the project's own pin), pydantic and PyYAML for its configs, pytest for its tests, ONNX
# Runtime for a policy that comes as ONNX (a file, a digest, a bundle, a models:/ champion).
"$pip" install -q pytest pydantic pyyaml mlflow==3.17.2 onnxruntime==1.32.0 -c "$work/constraints.txt"
