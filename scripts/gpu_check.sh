#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU, in one call, printing one JSON line at the end:
#   - the TensorRT engine build and check (edge/engine.py) and the runtime's TensorRT policy in
#     the control loop (edge/runtime.py TensorRTPolicy): tests/edge/test_engine.py,
#     tests/edge/test_runtime_tensorrt.py (they skip without TensorRT and a GPU; here they run);
#   - Isaac Lab on CUDA (`device: auto` picks the GPU): the Isaac Lab backend tests in the
#     isaaclab stage environment, and benchmarks/isaaclab_validation.py --device cuda;
#   - torch sees the GPU: `device: auto` trains there;
#   - PPO with the update on the GPU and the worlds on the CPU:
#     benchmarks/train_throughput.py --device cuda (collection and update seconds per iteration,
#     sequential and pipelined: the next rollout collected beside the update);
#   - overlapped validation on that machine's cores: benchmarks/sim_throughput.py, two groups
#     (each stepping on half the cores), the MLP on one CPU thread and on the GPU.
# The Python it runs: ${GPU_VENV:-/tmp/physai-gpu-venv} when it is there; else, where the
# wheels of scripts/gpu_wheels.sh lie in ${GPU_WHEELS:-.whl} (a machine without a package
# index: carry that folder), the machine's python3 with them installed under
# /tmp/physai-gpu-site; else a venv built from the package index. The logs land in ${OUT:-.}.
# Each step has its own time limit (60 or 150 for the Python, 30, 60, 120 + 60 for Isaac Lab,
# 120 + 120 + 120 for the benchmarks): the whole stays under 10 minutes.
# Usage: bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${GPU_VENV:-/tmp/physai-gpu-venv}
isaaclab=${ISAACLAB_VENV:-.venv-isaaclab}
out=${OUT:-.}
mkdir -p "$out"
start=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)

step() {  # step NAME SECONDS CMD...: run CMD with a time limit, log it, record its status
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@" > "$out/gpu_$name.log" 2>&1
    echo "$name=$?" >> "$out/gpu_status.txt"
}
: > "$out/gpu_status.txt"
wheels=${GPU_WHEELS:-.whl}
py="$venv/bin/python"
pythonpath=.
if [ ! -x "$py" ] && ls "$wheels"/*.whl > /dev/null 2>&1; then
    site=/tmp/physai-gpu-site
    step wheels 60 python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
    py=python3
    pythonpath=.:$site
elif [ ! -x "$py" ]; then
    step venv 150 bash -c "python3 -m venv '$venv' && '$venv/bin/pip' install -q torch==2.13.0 \
        && '$venv/bin/pip' install -q -e '.[dev]' tensorrt cuda-python polygraphy"
fi
nproc=$(nproc)
step torch_cuda 30 "$py" -c "import torch; assert torch.cuda.is_available(); \
print(torch.cuda.get_device_name(0))"
if "$py" -c "import tensorrt" > /dev/null 2>&1; then
    step edge_tensorrt 60 env PYTHONPATH="$pythonpath" MUJOCO_GL=egl "$py" -m pytest -q -rs \
        -p no:cacheprovider tests/edge/test_engine.py tests/edge/test_runtime_tensorrt.py
else  # the carried wheels leave TensorRT out (over a gigabyte): carry a venv that has it
    echo "edge_tensorrt=missing" >> "$out/gpu_status.txt"
fi
if [ -x "$isaaclab/bin/python" ]; then
    step isaaclab_tests 120 env PYTHONPATH=. "$isaaclab/bin/python" -m pytest -q -rs \
        -p no:cacheprovider tests/stages/sim/test_sim_isaaclab.py
    step isaaclab_bench 60 env PYTHONPATH=. "$isaaclab/bin/python" \
        benchmarks/isaaclab_validation.py --device cuda --repeat 1
else
    echo "isaaclab_tests=missing" >> "$out/gpu_status.txt"
fi
step ppo_cuda 120 env PYTHONPATH="$pythonpath" "$py" benchmarks/train_throughput.py \
    --device cuda --iterations 5 --repeat 3
step sim_overlap 120 env PYTHONPATH="$pythonpath" "$py" benchmarks/sim_throughput.py \
    --worlds 2048 --repeat 3 --gym-steps 10
step sim_overlap_gpu_policy 120 env PYTHONPATH="$pythonpath" "$py" benchmarks/sim_throughput.py \
    --worlds 2048 --repeat 3 --gym-steps 10 --policy-device cuda
[ -x "$py" ] || py=python3
"$py" - "$out" "$gpu" "$start" "$nproc" <<'PY'
import json, re, sys, time
from pathlib import Path
out, gpu, start, cores = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
status = dict(line.strip().split("=", 1) for line in (out / "gpu_status.txt").read_text().splitlines() if "=" in line)
def summary(name):
    log = out / f"gpu_{name}.log"
    text = log.read_text() if log.exists() else ""
    found = re.findall(r"^=*\s*(\d+ passed.*?)\s*=*$", text, re.M) or re.findall(r"^(\d+ (?:passed|failed|skipped).*)$", text, re.M)
    return found[-1] if found else None
def last_json(name):
    log = out / f"gpu_{name}.log"
    lines = [l for l in log.read_text().splitlines() if l.startswith("{")] if log.exists() else []
    return json.loads(lines[-1]) if lines else None
bench = last_json("isaaclab_bench")
print(json.dumps({"gpu": gpu, "cores": cores, "seconds": int(time.time()) - start,
                  "ok": all(v == "0" for v in status.values()), "status": status,
                  "edge_tensorrt": summary("edge_tensorrt"), "isaaclab_tests": summary("isaaclab_tests"),
                  "isaaclab_validation": bench, "ppo_cuda": last_json("ppo_cuda"),
                  "sim_overlap": last_json("sim_overlap"),
                  "sim_overlap_gpu_policy": last_json("sim_overlap_gpu_policy")}))
PY
