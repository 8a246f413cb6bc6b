#!/usr/bin/env bash
# Installs LeRobot 0.6.1 (its datasets and policies) into a venv of its own, the stage environment
# `lerobot` (stages/core/environments.py). LeRobot 0.6.1 needs Python >= 3.12 and torch < 2.12; the
# project runs Python 3.11 with the CPU torch 2.13, so it cannot share the project's venv.
# Here: pyenv's Python 3.12.1, torch 2.11 and torchvision 0.26 (CPU builds from PyTorch's CPU
# index where it answers; else the package index's CUDA builds, which run on the CPU but bring
# GBs of CUDA libraries; a CPU wheel in pip's find-links is taken either way), then
# lerobot[dataset] (pyarrow, pandas, datasets, PyAV 15 and torchcodec; without FFmpeg's shared
# libraries on the machine torchcodec does not load and LeRobot decodes its videos with PyAV),
# onnx (the project's pin: torch's ONNX exporter writes a LeRobot policy through it,
# stages/policies/lerobot_export.py) and pytest.
# Every download is retried: a dropped connection costs one attempt, not the build.
# Usage: scripts/install_lerobot.sh [VENV]   (default: .venv-lerobot); then run
#   VENV/bin/python -m pytest tests/lerobot
set -euo pipefail
venv="${1:-.venv-lerobot}"
base="${PHYSAI_LEROBOT_BASE_PYTHON:-$HOME/.pyenv/versions/3.12.1/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

retry() {
	local attempt
	for attempt in 1 2 3; do
		"$@" && return 0
		echo "install_lerobot.sh: attempt $attempt of 3 failed: $*" >&2
		sleep $((attempt * 10))
	done
	return 1
}

"$base" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --retries 10 --timeout 120)
torch=("torch==2.11.*" "torchvision==0.26.*")
cpu_index="https://download.pytorch.org/whl/cpu"
# Beside the package index, PyTorch's CPU index where it answers: its 2.11.0+cpu sorts above the
# index's 2.11.0, so pip takes the CPU build.
if "$venv/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], \
	timeout=10)" "$cpu_index/torch/" >/dev/null 2>&1; then
	torch+=(--extra-index-url "$cpu_index")
fi
retry "${pip[@]}" "${torch[@]}"
# LeRobot's own requirements must not move the torch just installed.
"$venv/bin/python" -m pip freeze | grep -E '^(torch|torchvision)==' > "$work/constraints.txt"
retry "${pip[@]}" "lerobot[dataset,accelerate-dep,diffusers-dep]==0.6.1" onnx==1.23.2 pytest -c "$work/constraints.txt"
"$venv/bin/python" -c "import lerobot.datasets.lerobot_dataset, accelerate, diffusers, av, onnx, torch, torchvision"
