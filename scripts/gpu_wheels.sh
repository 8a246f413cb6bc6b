#!/usr/bin/env bash
# Wheels for scripts/gpu_check.sh on a GPU machine that cannot reach a package index.
#
# Such a machine has Python 3.12 with torch, numpy, pandas, pyarrow, scipy and PyYAML, but none
# of the simulator, the RL library or the config layer the checks import. This downloads, here,
# the CPython 3.12 x86-64 wheels of those (the versions this checkout's .venv holds) into
# ${GPU_WHEELS:-.whl} (ignored by git); gpu_check.sh installs them there without an index
# (pip --no-index --no-deps --target). About 35 MB.
#
# TensorRT is not among them: its wheels are over a gigabyte. The TensorRT tests skip on a
# machine without it, and say so in gpu_check.sh's summary.
# Usage: bash scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${GPU_WHEELS:-.whl}
py=.venv/bin/python
[ -x "$py" ] || { echo "gpu_wheels.sh: no .venv here; run 'make setup' first" >&2; exit 2; }
# What the benchmarks and tests gpu_check.sh runs import that such a machine lacks.
packages="mujoco mujoco-core glfw gymnasium farama-notifications rsl-rl-lib tensordict pyvers
pydantic pydantic-core annotated-types typing-inspection boto3 botocore s3transfer jmespath
cryptography cffi pycparser pyopenssl pytz"
mkdir -p "$out"
for name in $packages; do
    version=$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out" \
        "$name==$version" 2>&1 | grep -v "is ignored: it is neither" || true
done
ls "$out"/*.whl | wc -l | xargs echo "gpu_wheels.sh: wheels in $out:"
