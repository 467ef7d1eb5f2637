#!/usr/bin/env bash
# `make test`: the CPU suite everywhere, the GPU suite where GPUs exist (a loud skip otherwise),
# and the Python suite where its package is importable. Sized to finish in about 5 minutes on one
# GPU (see docs/RELIABILITY.md, "Which target runs what").
# `make stress` (--stress): the long runs instead: ctest label stress and the Python stress marker.
# Usage: scripts/run-tests.sh [BUILD] [--stress]
set -uo pipefail
BUILD=${1:-build}
MODE=${2:-}
cd "$(dirname "$0")/.."
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
rc=0
start=$(date +%s)
# Runs "$@" and prints how long it took (the 5-minute budget is checked per suite).
timed() {
  local name=$1 t0=$SECONDS
  shift
  "$@" || rc=1
  echo "== $name: $((SECONDS - t0)) s"
}
no_gpu() {
  echo "=================================================================="
  echo "skipped: no GPU -- $1 did not run here"
  echo "=================================================================="
}
if [ "$MODE" = "--stress" ]; then
  if [ "${ngpu:-0}" -gt 0 ]; then
    echo "== stress suite ($ngpu GPUs): ctest -L stress"
    timed "stress suite" bash -c "cd '$BUILD' && ctest -L stress --output-on-failure"
  else
    no_gpu "the stress suite (ctest -L stress)"
  fi
  timed "Python stress suite" bash scripts/run-python-tests.sh "$BUILD" -m stress
else
  echo "== CPU suite"
  timed "CPU suite" bash -c "cd '$BUILD' && ctest -L cpu --output-on-failure"
  if [ "${ngpu:-0}" -gt 0 ]; then
    echo "== GPU suite ($ngpu GPUs)"
    # Several test processes share the GPU at once, at most EPKIT_TEST_JOBS (default 8) PEs in all (each
    # test's PROCESSORS is its rank count; more PEs at once failed NVSHMEM's heap mapping): the tests spend most
    # of their time in process start-up, NVSHMEM bootstrap and host references, and kernels of
    # different processes time-slice the GPU (each process's spin-waiting kernels stay co-resident).
    timed "GPU suite" bash -c "cd '$BUILD' && ctest -L gpu -j ${EPKIT_TEST_JOBS:-8} --output-on-failure"
  else
    no_gpu "the GPU suite (ctest -L gpu)"
  fi
  timed "Python suite" bash scripts/run-python-tests.sh "$BUILD" -m "not stress"
fi
echo "== total: $(( $(date +%s) - start )) s"
exit $rc
