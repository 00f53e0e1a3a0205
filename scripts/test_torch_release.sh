#!/usr/bin/env bash
# The README's test command against another torch release than the default 2.13.0
# (the project supports >=2.13,<2.15): run it after a change to the build, the
# registration or an integration patch.
#   bash scripts/test_torch_release.sh                  # torch==2.14.1, the whole test command
#   bash scripts/test_torch_release.sh torch==2.14.1 tests/python/test_stacks_titan.py
# The tree (committed and uncommitted files, not build outputs) is copied to
# $TORCH_PJRT_RELEASE_TREE (default: a folder under /tmp named after the release), which keeps
# its own .venv and build/ between runs, so that the main checkout's build is left alone.
# torch 2.14.1 on x86_64 is a CUDA build of about 5.5 GB in that venv (it runs on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SPEC="${1:-torch==2.14.1}"
[ $# -gt 0 ] && shift
TREE="${TORCH_PJRT_RELEASE_TREE:-/tmp/torch_pjrt-${SPEC//[^A-Za-z0-9.]/_}}"
mkdir -p "$TREE"
# The files git knows or would add, afresh (the copy's own .venv and build/ stay: incremental).
find "$TREE" -mindepth 1 -maxdepth 1 ! -name .venv ! -name build -exec rm -rf {} +
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
  | tar --null -T - -cf - | tar -xf - -C "$TREE"
# PyTorch's test files, found relative to the checkout by default.
UPSTREAM_DIRS=()
IFS=: read -ra WANTED <<< "${TORCH_PJRT_UPSTREAM_DIR:-../shared/upstream:../shared/upstream-next}"
for d in "${WANTED[@]}"; do [ -d "$d" ] && UPSTREAM_DIRS+=("$(cd "$d" && pwd)"); done
export TORCH_PJRT_UPSTREAM_DIR
TORCH_PJRT_UPSTREAM_DIR=$(IFS=:; echo "${UPSTREAM_DIRS[*]:-/nonexistent}")
cd "$TREE"
echo "== $SPEC in $TREE (from $ROOT)"
TORCH_SPEC="$SPEC" bash scripts/setup.sh
.venv/bin/python -c "import torch, torch_pjrt; print('== torch', torch.__version__, 'with torch_pjrt from', torch_pjrt.__file__)"
TORCH_SPEC="$SPEC" bash scripts/test.sh "$@"
