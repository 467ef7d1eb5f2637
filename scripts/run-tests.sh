#!/usr/bin/env bash
# `make test`: the CPU suite everywhere, the GPU suite where GPUs exist (a loud skip otherwise),
# and the Python suite where its package is importable.
set -uo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
rc=0
echo "== CPU suite"
(cd "$BUILD" && ctest -L cpu --output-on-failure) || rc=1
if [ "${ngpu:-0}" -gt 0 ]; then
  echo "== GPU suite ($ngpu GPUs)"
  (cd "$BUILD" && ctest -L gpu --output-on-failure) || rc=1
else
  echo "=================================================================="
  echo "skipped: no GPU -- the GPU suite (ctest -L gpu) did not run here"
  echo "=================================================================="
fi
if [ -x scripts/run-python-tests.sh ]; then
  bash scripts/run-python-tests.sh "$BUILD" || rc=1
fi
exit $rc
