#!/usr/bin/env bash
# The checks that need an NVIDIA GPU: the TensorRT engine build and check (edge/engine.py) and
# the runtime's TensorRT policy in the control loop (edge/runtime.py TensorRTPolicy). On a
# machine without one these tests skip; here they must run. Usage: bash scripts/gpu_check.sh
# (a venv is built under ${GPU_VENV:-/tmp/physai-gpu-venv}; the results land in ${OUT:-.}).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GPU_VENV:-/tmp/physai-gpu-venv}
out=${OUT:-.}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
test -x "$venv/bin/python" || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q torch==2.13.0
"$venv/bin/python" -m pip install -q -e '.[dev]' tensorrt cuda-python polygraphy
"$venv/bin/python" - <<'PY' | tee -a "$out/gpu.txt"
import tensorrt, cuda
print("tensorrt", tensorrt.__version__)
PY
MUJOCO_GL=egl "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider \
    tests/edge/test_engine.py tests/edge/test_runtime_tensorrt.py 2>&1 | tee "$out/gpu_tests.txt"
