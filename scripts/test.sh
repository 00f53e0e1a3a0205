#!/usr/bin/env bash
# Runs every test: C++ unit tests for the torch-free layers, then side by side: a slice of
# the plugin qualification battery (every kernel and buffer check, training families with one
# optimizer in every mode; the whole battery is `python -m torch_pjrt.qualify`),
# the packaging check (scripts/test_packaging.sh --reuse-build; without the flag it also
# builds from scratch in a new venv) and a slice of PyTorch's own device-generic test files
# (scripts/upstream.sh runs them whole); pytest in strict eager mode (the whole suite,
# in two shards); the op, view, autograd, training and model tests in fused eager mode.
set -euo pipefail
cd "$(dirname "$0")/.."
section() { echo "== $* (${SECONDS}s into the run)"; }  # the elapsed time shows where CI spends it
bash scripts/setup.sh
PLUGIN=$(.venv/bin/python -c "import torch_pjrt._plugins as p; print(p.choose_plugin().path)")
section "C++ tests (plugin: $PLUGIN)"
TORCH_PJRT_TEST_PLUGIN="$PLUGIN" ./build/cpp_tests --gtest_brief=1
export TORCH_PJRT_CACHE_DIR="${TORCH_PJRT_CACHE_DIR:-$(mktemp -d)}"
if [ $# -gt 0 ]; then  # a selection: run it once, in the mode the environment names
  .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
  exit
fi
# The rest runs as four jobs side by side, each logging to its own file (shown whole, with its
# time, when all are done): no one of them keeps both cores busy alone (pytest runs one
# process; packaging and the upstream slice wait on pip and on subprocesses).
#  - the qualification slice, the packaging check, a slice of PyTorch's own test files, then
#    part of the strict pass (Lightning, PEFT/TRL, the qualification battery's tests);
#  - most of the strict pass in two shards: the tests that run models, servers and worker
#    processes, and the rest;
#  - the fused pass: the op, view, autograd, training and model tests again, less what does
#    not depend on the eager mode (compiled model training and generation, debug mode); then
#    the last part of the strict pass (Ray Train, ranks as threads).
# Four jobs share the cores: torch's OpenMP threads beyond a job's share of them spin-wait
# against each other (a GPT training test took 200 s with four copies side by side on 2
# cores and 2 threads each, 34 s with 1 thread each; 13 s alone).
CORES=$(nproc)
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( CORES / 4 > 1 ? CORES / 4 : 1 ))}"
LOGS=$(mktemp -d)
job() {  # job NAME COMMAND...: runs in the background, its output and exit status under $LOGS
  local name=$1
  shift
  ( start=$SECONDS; rc=0; "$@" > "$LOGS/$name.log" 2>&1 || rc=$?; echo "$rc $((SECONDS - start))" > "$LOGS/$name.status" ) &
}
# TORCH_PJRT_UPSTREAM_DIR: directories of PyTorch's test files, separated by ':'.
IFS=: read -ra WANTED <<< "${TORCH_PJRT_UPSTREAM_DIR:-../shared/upstream:../shared/upstream-next}"
UPSTREAM=()
for d in "${WANTED[@]}"; do
  if [ -d "$d" ]; then UPSTREAM+=("$d"); else
    section "PyTorch's own test files from $d: NOT RUN, no such directory (set TORCH_PJRT_UPSTREAM_DIR to PyTorch's test/)"
  fi
done
qualify_packaging_upstream_stacks() {
  echo "== Plugin qualification (slice)"
  # (HF GPT-2 training in every mode and the LSTM's eager modes are the pytest passes' own
  # test_hf.py and test_rnn.py; the slice keeps what only the battery runs.)
  .venv/bin/python -m torch_pjrt.qualify --only kernels,buffers,collectives,training.embedding-head.sgd.,training.mlp.adamw.,\
training.cnn-batchnorm.adamw-fused.,training.lstm.sgd.compiled,training.hf-llama.adamw-fused. \
    || return  # (errexit is off in a function run under ||)
  echo "== Packaging ($((SECONDS - start))s into this job)"
  # The wheel, from setup.sh's build (no second from-scratch build: scripts/test_packaging.sh
  # without --reuse-build does that, in a new venv), installed into a new venv that holds torch.
  bash scripts/test_packaging.sh --reuse-build || return
  if [ ${#UPSTREAM[@]} -gt 0 ]; then
    # A fixed, evenly spread sample of each file plus every failure the spec strictly expects on
    # pjrt alone: a new failure or an expected failure that starts passing turns this red (a
    # non-strict entry cannot, so the full run alone has those). The full run is scripts/upstream.sh.
    echo "== PyTorch's own test files (slice; from ${UPSTREAM[*]}) ($((SECONDS - start))s into this job)"
    .venv/bin/python -m torch_pjrt.tools.upstream "${UPSTREAM[@]}" --sample "${TORCH_PJRT_UPSTREAM_SAMPLE:-8}" \
      --jobs 2 || return
  fi
  echo "== Strict eager: $STRICT_FIRST ($((SECONDS - start))s into this job)"
  # shellcheck disable=SC2086
  TORCH_PJRT_EAGER_MODE=strict "${PYTEST[@]}" $STRICT_FIRST
}
fused_then_strict() {
  # shellcheck disable=SC2086
  TORCH_PJRT_EAGER_MODE=fused "${PYTEST[@]}" $FUSED -k "not (test_gpt_trains_like_cpu and compiled) and not \
(test_cnn_trains_like_cpu and compiled) and not debug_mode and not test_hf_compiled_training and not \
test_static_cache_generation and not test_accelerate_launch_starts_ddp_on_pjrt" || return
  echo "== Strict eager: $STRICT_LAST ($((SECONDS - start))s into this job)"
  # shellcheck disable=SC2086
  TORCH_PJRT_EAGER_MODE=strict "${PYTEST[@]}" $STRICT_LAST
}
HEAVY=""
# (Balanced by the last run's times: each job about 25 minutes beside the others on a slow 2-core machine.)
for t in zoo serving_vllm stacks_hf distributed compile doctor registration integrations \
         pretrained hf models training flex_attention; do
  HEAVY="$HEAVY tests/python/test_$t.py"
done
# Two more parts of the strict pass, balancing the jobs by the last run's times: after the
# upstream slice in the first job, and after the fused pass.
STRICT_FIRST="tests/python/test_stacks_lightning.py tests/python/test_stacks_peft_trl.py tests/python/test_qualify.py \
tests/python/test_upstream_runner.py tests/python/test_bounded_shapes.py"
STRICT_LAST="tests/python/test_stacks_ray.py tests/python/test_distributed_threads.py"
IGNORE=""
for f in $HEAVY $STRICT_FIRST $STRICT_LAST; do IGNORE="$IGNORE --ignore=$f"; done
FUSED=""
for t in ops ops_extra checks_as_cpu out_variants nn rnn complex linalg layouts special compat indexing views foreach rng training models hf pretrained autocast serialization errors device_module stacks_hf graphs float8 paged_attention; do
  FUSED="$FUSED tests/python/test_$t.py"
done
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider --durations=30)
section "Four jobs side by side (logs: $LOGS)"
job qualify-packaging-upstream-stacks qualify_packaging_upstream_stacks
# shellcheck disable=SC2086
job strict-models env TORCH_PJRT_EAGER_MODE=strict TORCH_PJRT_TEST_SLOWDOWN=2 "${PYTEST[@]}" $HEAVY
# shellcheck disable=SC2086
job strict-ops env TORCH_PJRT_EAGER_MODE=strict "${PYTEST[@]}" tests/python $IGNORE
# shellcheck disable=SC2086
job fused-then-strict fused_then_strict
wait
FAILED=()
for name in qualify-packaging-upstream-stacks strict-models strict-ops fused-then-strict; do
  read -r rc took < "$LOGS/$name.status"
  section "$name: exit $rc after ${took}s"
  cat "$LOGS/$name.log"
  [ "$rc" -eq 0 ] || FAILED+=("$name")
done
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "FAILED: ${FAILED[*]}" >&2
  exit 1
fi
section "Done"
