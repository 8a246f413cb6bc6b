#!/usr/bin/env bash
# Installs a manipulation benchmark into a Python 3.11 venv of its own, its stage environment
# (stages/core/environments.py, docs/benchmarks.md). Neither runs on the project's MuJoCo 4.0,
# and a MuJoCo 3 installed over 4.0's split packages (mujoco, mujoco-core, mujoco-studio) breaks
# them, so each takes the MuJoCo it runs on, in a venv of its own:
# - metaworld: Meta-World 3.1.1 (its 50 Sawyer tasks, the MT/ML benchmarks and a scripted
#   policy per task) with its own pin, MuJoCo 3.3.0 (4.0 grew a weld's eq_data from 11 to 12
#   numbers);
# - gymnasium-robotics: Gymnasium-Robotics 1.4.2 (the Fetch arm's reach, push, slide and
#   pick-and-place tasks, the Shadow hand's, and their assets) with MuJoCo 3.11.0, the last
#   release its Fetch code runs on unpatched (from 3.12 mjtJoint members no longer compare equal
#   to numpy ints).
# Beside it, what the project's stages need when they run there (PYTHONPATH=<repo>
# VENV/bin/python -m stages.pipeline.envrun ...): torch 2.13 (the CPU build from PyTorch's CPU
# index where it answers; else the package index's CUDA build, which runs on the CPU but brings
# GBs of CUDA libraries; a CPU wheel in pip's find-links is taken either way), Gymnasium 1.4.0
# (the project's pin), pydantic and PyYAML for its configs, MLflow for lineage (the project's
# pin), ONNX Runtime for a policy that comes as ONNX, h5py for the demonstrations a collect stage
# writes, boto3 for an s3:// artifact store, pytest, and packaging (Gymnasium 1.4's
# mujoco_rendering imports it without declaring it).
# Every download is retried: a dropped connection costs one attempt, not the build.
# Usage: scripts/install_benchmark.sh metaworld|gymnasium-robotics [VENV]
#   (default VENV: .venv-<benchmark>); then, e.g.,
#   PYTHONPATH=. VENV/bin/python -m stages.sim.backends.gymnasium_tasks describe \
#       metaworld:Meta-World/MT1 '[{"env_name": "pick-place-v3"}]'
set -euo pipefail
benchmark="${1:?usage: scripts/install_benchmark.sh metaworld|gymnasium-robotics [VENV]}"
venv="${2:-.venv-$benchmark}"
# Each benchmark: its packages, and a check that it registers its Gymnasium ids when imported
# and that one of its environments makes and resets.
case "$benchmark" in
metaworld)
	packages=(metaworld==3.1.1 mujoco==3.3.0)
	check="import metaworld.policies; gymnasium.make('Meta-World/MT1', \
env_name='pick-place-v3').reset(seed=0)" ;;
gymnasium-robotics)
	packages=(gymnasium-robotics==1.4.2 mujoco==3.11.0)
	check="import gymnasium_robotics; gymnasium.make('FetchPickAndPlace-v4').reset(seed=0)" ;;
*)
	echo "install_benchmark.sh: unknown benchmark '$benchmark' (metaworld, gymnasium-robotics)" >&2
	exit 2 ;;
esac
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

retry() {
	local attempt
	for attempt in 1 2 3; do
		"$@" && return 0
		echo "install_benchmark.sh: attempt $attempt of 3 failed: $*" >&2
		sleep $((attempt * 10))
	done
	return 1
}

python3.11 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --retries 10 --timeout 120)
torch=("torch==2.13.0")
cpu_index="https://download.pytorch.org/whl/cpu"
# Beside the package index, PyTorch's CPU index where it answers: its 2.13.0+cpu sorts above the
# index's 2.13.0, so pip takes the CPU build.
if "$venv/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], \
	timeout=10)" "$cpu_index/torch/" >/dev/null 2>&1; then
	torch+=(--extra-index-url "$cpu_index")
fi
retry "${pip[@]}" "${torch[@]}"
# Nothing after this may move the torch just installed.
"$venv/bin/python" -m pip freeze | grep -E '^torch==' > "$work/constraints.txt"
retry "${pip[@]}" "${packages[@]}" gymnasium==1.4.0 "numpy>=1.26" "pydantic>=2.7,<3" \
	"pyyaml>=6" "h5py>=3.10" "boto3>=1.40,<2" mlflow==3.17.2 onnxruntime==1.32.0 packaging \
	pytest -c "$work/constraints.txt"
"$venv/bin/python" -W ignore -c "import gymnasium, h5py, mlflow, onnxruntime, torch, yaml; $check"
