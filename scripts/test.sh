#!/usr/bin/env bash
# Runs every test: C++ unit tests for the torch-free layers, a slice of the
# plugin qualification battery (every kernel and buffer check, each training
# family with one optimizer in every mode; the whole battery is
# `python -m torch_pjrt.qualify`), then pytest in strict eager mode (the whole
# suite), then the op, view, autograd, training and model tests again in fused
# eager mode (less what does not depend on the eager mode: compiled model
# training and generation, debug mode, the conformance slice). Between the two, the packaging
# check (scripts/test_packaging.sh) and a slice of PyTorch's own device-generic
# test files (scripts/upstream.sh runs them whole).
set -euo pipefail
cd "$(dirname "$0")/.."
section() { echo "== $* (${SECONDS}s into the run)"; }  # the elapsed time shows where CI spends it
bash scripts/setup.sh
PLUGIN=$(.venv/bin/python -c "import torch_pjrt._plugins as p; print(p.choose_plugin().path)")
section "C++ tests (plugin: $PLUGIN)"
TORCH_PJRT_TEST_PLUGIN="$PLUGIN" ./build/cpp_tests --gtest_brief=1
export TORCH_PJRT_CACHE_DIR="${TORCH_PJRT_CACHE_DIR:-$(mktemp -d)}"
if [ $# -eq 0 ]; then
  section "Plugin qualification (slice)"
  .venv/bin/python -m torch_pjrt.qualify --only kernels,buffers,training.embedding-head.sgd.,training.mlp.adamw.,\
training.cnn-batchnorm.adamw-fused.,training.lstm.sgd.,training.hf-gpt2.adamw.,training.hf-llama.adamw-fused.
fi
if [ $# -gt 0 ]; then  # a selection: run it once, in the mode the environment names
  .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
  exit
fi
# pip install / pip wheel --no-build-isolation into new venvs that hold torch.
section "Packaging"
bash scripts/test_packaging.sh
# TORCH_PJRT_UPSTREAM_DIR: directories of PyTorch's test files, separated by ':'.
IFS=: read -ra WANTED <<< "${TORCH_PJRT_UPSTREAM_DIR:-../shared/upstream:../shared/upstream-next}"
UPSTREAM=()
for d in "${WANTED[@]}"; do
  if [ -d "$d" ]; then UPSTREAM+=("$d"); else
    section "PyTorch's own test files from $d: NOT RUN, no such directory (set TORCH_PJRT_UPSTREAM_DIR to PyTorch's test/)"
  fi
done
if [ ${#UPSTREAM[@]} -gt 0 ]; then
  # A fixed, evenly spread sample of each file plus every test the spec names: a new
  # failure or an expected failure that starts passing turns this red. The full run is
  # scripts/upstream.sh.
  section "PyTorch's own test files (slice; from ${UPSTREAM[*]})"
  .venv/bin/python -m torch_pjrt.tools.upstream "${UPSTREAM[@]}" --sample "${TORCH_PJRT_UPSTREAM_SAMPLE:-12}" --jobs 2
fi
section "Python tests, strict eager"
TORCH_PJRT_EAGER_MODE=strict .venv/bin/python -m pytest -q -p no:cacheprovider tests/python
section "Python tests, fused eager"
FUSED=""
for t in ops ops_extra checks_as_cpu out_variants nn rnn complex linalg layouts special compat indexing views foreach rng training models hf pretrained autocast serialization errors device_module stacks_hf; do
  FUSED="$FUSED tests/python/test_$t.py"
done
# shellcheck disable=SC2086
TORCH_PJRT_EAGER_MODE=fused .venv/bin/python -m pytest -q -p no:cacheprovider $FUSED \
  -k "not (test_gpt_trains_like_cpu and compiled) and not (test_cnn_trains_like_cpu and compiled) and not debug_mode \
and not test_hf_compiled_training and not test_static_cache_generation"
section "Done"
