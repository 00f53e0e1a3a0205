#!/usr/bin/env bash
# The main job: trains a small transformer on the pjrt device and on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/train_transformer.py "$@"
