#!/usr/bin/env bash
# Runs every test: C++ unit tests for the torch-free layers, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PLUGIN=$(.venv/bin/python -c "import torch_pjrt._plugins as p; print(p.choose_plugin().path)")
echo "== C++ tests (plugin: $PLUGIN)"
TORCH_PJRT_TEST_PLUGIN="$PLUGIN" ./build/cpp_tests --gtest_brief=1
echo "== Python tests"
export TORCH_PJRT_CACHE_DIR="${TORCH_PJRT_CACHE_DIR:-$(mktemp -d)}"
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
