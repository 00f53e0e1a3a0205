#!/usr/bin/env bash
# Packaging as a user meets it: a new venv that already has torch, then
#   pip install --no-build-isolation .         (builds the extension against that torch)
#   pip wheel --no-build-isolation --no-deps . (a wheel), installed into a second new venv
# each checked by running ops on pjrt against CPU PyTorch; then a wheel built for one torch
# installed beside another minor release must refuse to import and say why.
#   bash scripts/test_packaging.sh                 # torch 2.13.0 (the CPU build)
#   TORCH_SPEC=torch==2.14.1 bash scripts/test_packaging.sh
# OTHER_TORCH=torch==2.14.1 adds the mismatch check (a multi-GB install; not in CI).
#   bash scripts/test_packaging.sh --reuse-build   # CI: the wheel only, from scripts/setup.sh's build
# --reuse-build skips the from-scratch build in a new venv (the one expensive step; setup.sh's own
# `pip install -e .` already builds through setup.py): `pip wheel` runs in .venv over build/ with
# setup.sh's configuration, so CMake finds nothing to do, and the wheel goes into a new venv
# with its own torch (what a user's install meets: the package list, _build_info.json, the
# autoload entry point, the module's RPATH into that venv's torch).
set -euo pipefail
REUSE_BUILD=0
[ "${1:-}" = "--reuse-build" ] && REUSE_BUILD=1
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PY=${PYTHON:-python3}
WORK="${PACKAGING_WORK:-$ROOT/build/packaging}"
mkdir -p "$WORK"
tag=$(echo "$TORCH_SPEC" | tr -c 'A-Za-z0-9.\n' '_')

new_venv() {  # new_venv DIR TORCH_SPEC: a venv with torch (and setuptools, which torch requires)
  rm -rf "$1"
  "$PY" -m venv "$1"
  "$1/bin/python" -m pip install -q --disable-pip-version-check "$2" setuptools 2>&1 | grep -v "^WARNING: Location" || true
}

check() {  # check PYTHON: ops on pjrt equal CPU PyTorch, through `import torch` alone (autoload)
  (cd "$WORK" && "$1" - <<'EOF'
import json, os, torch
import importlib.util
x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
y = (x.to("pjrt") @ x.T.to("pjrt")).relu().sum(1).cpu()
torch.testing.assert_close(y, (x.double() @ x.T.double()).relu().sum(1).float(), rtol=1e-5, atol=1e-5)
print(torch.randn(2, device="pjrt"))
import torch_pjrt
origin = os.path.dirname(torch_pjrt.__file__)
assert "site-packages" in origin, origin  # the installed package, not the checkout
info = json.load(open(os.path.join(origin, "_build_info.json")))
print(f"packaging: torch {torch.__version__}, built against {info['torch']}, {torch_pjrt.platform()['platform']} "
      f"plugin, package at {origin}")
EOF
  )
}

export MAX_JOBS=${MAX_JOBS:-2}
rm -rf "$WORK/dist-$tag"
if [ "$REUSE_BUILD" = 1 ]; then
  echo "== packaging: pip wheel --no-build-isolation from .venv over setup.sh's build/"
  TORCH_PJRT_BUILD_DIR="$ROOT/build" TORCH_PJRT_BUILD_TESTS=1 TORCH_PJRT_OUTPUT_DIR="$ROOT/torch_pjrt" \
    PATH="$ROOT/.venv/bin:$PATH" "$ROOT/.venv/bin/python" -m pip wheel -q --disable-pip-version-check \
    --no-build-isolation --no-deps "$ROOT" -w "$WORK/dist-$tag" 2>&1 | grep -vE "^WARNING: Location" || true
else
  echo "== packaging: a venv with $TORCH_SPEC; pip install --no-build-isolation ."
  V1="$WORK/venv-$tag-install"
  new_venv "$V1" "$TORCH_SPEC"
  TORCH_PJRT_BUILD_DIR="$WORK/build-$tag" "$V1/bin/python" -m pip install -q --disable-pip-version-check \
    --no-build-isolation "$ROOT" 2>&1 | grep -vE "^WARNING: Location" || true
  check "$V1/bin/python"
  echo "== packaging: pip wheel --no-build-isolation, installed into a second venv"
  TORCH_PJRT_BUILD_DIR="$WORK/build-$tag" "$V1/bin/python" -m pip wheel -q --disable-pip-version-check \
    --no-build-isolation --no-deps "$ROOT" -w "$WORK/dist-$tag" 2>&1 | grep -vE "^WARNING: Location" || true
fi
WHEEL=$(ls "$WORK/dist-$tag"/torch_pjrt-*.whl)
echo "packaging: $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1))"
"$PY" -c "import sys, zipfile; names = zipfile.ZipFile(sys.argv[1]).namelist()
assert 'torch_pjrt/_build_info.json' in names and any(n.startswith('torch_pjrt/_C') for n in names), names" "$WHEEL" \
  || { echo "packaging: the wheel lacks the extension or _build_info.json" >&2; exit 1; }
V2="$WORK/venv-$tag-wheel"
new_venv "$V2" "$TORCH_SPEC"
"$V2/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL" 2>&1 | grep -v "^WARNING: Location" || true
check "$V2/bin/python"

if [ -n "${OTHER_TORCH:-}" ]; then
  echo "== packaging: that wheel beside $OTHER_TORCH must refuse to import"
  V3="$WORK/venv-mismatch"
  new_venv "$V3" "$OTHER_TORCH"
  "$V3/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$WHEEL" 2>&1 \
    | grep -v "^WARNING: Location" || true
  (cd "$WORK" && "$V3/bin/python" - <<'EOF'
import warnings
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    import torch  # autoload: a warning, and torch itself still imports
assert any("was built against torch" in str(w.message) for w in seen), [str(w.message) for w in seen]
try:
    import torch_pjrt
except ImportError as e:
    assert "Rebuild it against this torch" in str(e), e
    print("packaging: refused as it should:", str(e)[:120], "...")
else:
    raise AssertionError("torch_pjrt imported under a torch it was not built for")
EOF
  )
fi
echo "packaging: OK ($TORCH_SPEC)"
