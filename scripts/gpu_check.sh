#!/usr/bin/env bash
# One short check for a machine with an NVIDIA GPU, torch's CUDA build and
# jax-cuda13-pjrt, and no package registry: builds the extension against that
# machine's torch, qualifies the CUDA PJRT plugin (python -m torch_pjrt.qualify,
# a slice), runs a test slice on it, then the training benchmark with torch's own
# CUDA eager and inductor as the baseline columns.
#   bash scripts/gpu_check.sh            (PYTHON=..., PJRT_INCLUDE_DIR=... to override)
# The PJRT C API header is not in this repository: it is taken from an installed
# package that ships it (xla-cpu-pjrt here), from PJRT_INCLUDE_DIR, or from a copy
# under ../shared/pjrt_include beside the checkout.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"

HDR="${PJRT_INCLUDE_DIR:-}"
if [ -z "$HDR" ]; then
  HDR="$("$PY" - <<'PYEOF'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages(), os.path.join(os.getcwd(), "..", "shared")]
for root in roots:
    for hit in glob.glob(os.path.join(root, "**", "pjrt_c_api.h"), recursive=True):
        print(os.path.dirname(hit)); sys.exit(0)
PYEOF
)"
fi
[ -n "$HDR" ] && [ -f "$HDR/pjrt_c_api.h" ] || { echo "gpu_check: pjrt_c_api.h not found (set PJRT_INCLUDE_DIR)" >&2; exit 1; }
echo "== build (PJRT header: $HDR)"
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S . -B build-gpu "${GEN[@]}" -DPython3_EXECUTABLE="$(command -v "$PY")" -DPJRT_INCLUDE_DIR="$HDR" \
  -DTORCH_PJRT_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-gpu -j "$(nproc)" 2>&1 | tail -3
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" TORCH_PJRT_PLUGIN=cuda TORCH_PJRT_CACHE_DIR="$ROOT/build-gpu/cache"
"$PY" -c "import torch_pjrt, torch; print('pjrt devices:', torch.pjrt.device_count(), torch_pjrt.platform())"

echo "== qualification of the CUDA plugin (kernels, buffers, differential training)"
"$PY" -m torch_pjrt.qualify --only kernels,buffers,training.embedding-head,training.cnn,training.hf-gpt2.adamw \
  2>&1 | tail -40 || true

echo "== test slice on the CUDA plugin"
"$PY" -m pytest -q -x -p no:cacheprovider tests/python/test_ops.py tests/python/test_views.py \
  tests/python/test_compile.py tests/python/test_models.py -k "not second_process" 2>&1 | tail -5 || true

echo "== training steps: pjrt (CUDA plugin) vs torch CUDA eager and inductor"
"$PY" benchmarks/bench_models.py --rows "GPT 4x128, sdpa, f32;HF GPT-2;SmallCNN" --steps 20 \
  --baseline-device cuda 2>&1 | grep -v "^W1\|Warning"
