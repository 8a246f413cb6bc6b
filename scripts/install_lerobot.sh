#!/usr/bin/env bash
# Installs LeRobot 0.6.1 (its datasets and policies) into a venv of its own, the stage environment
# `lerobot` (stages/environments.py). LeRobot 0.6.1 needs Python >= 3.12 and torch < 2.12; the
# project runs Python 3.11 with the CPU torch 2.13, so it cannot share the project's venv.
# Here: pyenv's Python 3.12.1, the package index's torch 2.11 and torchvision 0.26 (CUDA builds,
# which run on the CPU; no CPU build of 2.11 is on this machine's disk), then lerobot[dataset]
# (pyarrow, pandas, datasets, PyAV 15 and torchcodec; without FFmpeg's shared libraries on the
# machine torchcodec does not load and LeRobot decodes its videos with PyAV) and pytest.
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
retry "${pip[@]}" "torch==2.11.*" "torchvision==0.26.*"
# LeRobot's own requirements must not move the torch just installed.
"$venv/bin/python" -m pip freeze | grep -E '^(torch|torchvision)==' > "$work/constraints.txt"
retry "${pip[@]}" "lerobot[dataset]==0.6.1" pytest -c "$work/constraints.txt"
"$venv/bin/python" -c "import lerobot.datasets.lerobot_dataset, av, torch, torchvision"
