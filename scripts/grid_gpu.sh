#!/usr/bin/env bash
# The paper profile on one GPU (issue 16): 4 tasks x 5 seeds of the 10.6 M base model, the 5
# seeds of each task trained as one batched model, and the grid's summary with its provenance.
#
#   bash scripts/grid_gpu.sh [OUT]      # OUT defaults to book/results/grid_paper-base.json
#
# Needs the README's environment with the CUDA build of torch 2.13.0 (see "Running on a GPU").
# PYTHON overrides the interpreter (default .venv/bin/python, else python3). Prints the wall
# time against the issue's goal of 10 minutes on one H200.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-book/results/grid_paper-base.json}
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())"
start=$(date +%s)
"$py" -m nopelib.grid paper-base --device cuda --batched --out "$out"
wall=$(( $(date +%s) - start ))
echo "paper-base grid: ${wall} s wall (goal: 600 s on one H200)"
