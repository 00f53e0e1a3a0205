#!/usr/bin/env bash
# PyTorch's own device-generic test files on pjrt (python -m torch_pjrt.tools.upstream).
# The project never commits PyTorch's files: they come from a directory given as
# TORCH_PJRT_UPSTREAM_DIR, directories separated by ':' (default ../shared/upstream and
# ../shared/upstream-next; any PyTorch checkout's test/ works).
#   bash scripts/upstream.sh                      # every test of every file, writes docs/upstream.md
#   bash scripts/upstream.sh --files test_masked.py --report /tmp/masked.md
# Extra arguments go to the runner. A full run takes hours on 2 cores (test_ops.py most
# of them); SKIP_SETUP=1 skips scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh
fi
IFS=: read -ra UPSTREAM <<< "${TORCH_PJRT_UPSTREAM_DIR:-../shared/upstream:../shared/upstream-next}"
export TORCH_PJRT_CACHE_DIR="${TORCH_PJRT_CACHE_DIR:-$(mktemp -d)}"
if [ $# -eq 0 ]; then
  set -- --report docs/upstream.md
fi
.venv/bin/python -m torch_pjrt.tools.upstream "${UPSTREAM[@]}" "$@"
