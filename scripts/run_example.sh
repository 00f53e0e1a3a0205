#!/usr/bin/env bash
# The main job: trains a GPT-style transformer compiled on pjrt next to CPU PyTorch, then
# benchmarks every way of running it side by side (examples/main_job.py; table and plot in
# build/main_job/). examples/train_transformer.py is the plain eager training script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/main_job.py "$@"
