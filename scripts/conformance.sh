#!/usr/bin/env bash
# Regenerates docs/conformance.md and docs/conformance.json: every OpInfo of torch's
# op_db on the pjrt device against the CPU (forward, backward, non-contiguous, out=),
# each op in a worker process. Takes about half an hour on 2 cores.
#   bash scripts/conformance.sh                 # the whole report
#   bash scripts/conformance.sh --jobs 2        # extra arguments go to the harness
# SKIP_SETUP=1 skips scripts/setup.sh (when the extension is built elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh
fi
# A fresh compile cache (removed afterwards), so the whole-run time in the report is the cold one.
if [ -z "${TORCH_PJRT_CACHE_DIR:-}" ]; then
  TORCH_PJRT_CACHE_DIR=$(mktemp -d)
  trap 'rm -rf "$TORCH_PJRT_CACHE_DIR"' EXIT
  export TORCH_PJRT_CACHE_DIR
fi
.venv/bin/python -m torch_pjrt.tools.conformance --all --write-report "$@"
