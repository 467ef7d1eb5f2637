#!/usr/bin/env bash
# compute-sanitizer over the GPU suite.
# Usage: scripts/sanitize.sh BUILD_DIR [memcheck|racecheck|synccheck ...]
# memcheck runs every test of test_all_to_all at 2 ranks (both data paths: --dp 1 covers the
# portable test too); racecheck and synccheck, which are far slower, run the split-phase test
# (dispatch_send / foreign kernel / dispatch_recv / combine). Kernels run far slower under the
# tools, hence the long device-side timeout. API errors are not reported: NCCL, which NVSHMEM
# initialises its teams with, probes kernels for other architectures and gets (and handles)
# cudaErrorNoKernelImageForDevice; a real API error in epkit raises epkit::Error and fails the test.
set -uo pipefail
BUILD=${1:?usage: scripts/sanitize.sh BUILD_DIR [tool...]}; shift
TOOLS=("${@:-memcheck}")
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 EPKIT_TIMEOUT_MS=${EPKIT_TIMEOUT_MS:-120000}
rc=0
for tool in "${TOOLS[@]}"; do
  filter='*SplitPhases*'
  [ "$tool" = memcheck ] && filter='*'
  echo "== compute-sanitizer --tool $tool, tests $filter"
  "$BUILD/bin/epkit-run" -n 2 -- compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 9 \
    --print-limit 20 "$BUILD/tests/gpu/test_all_to_all" --gtest_filter="$filter" --dp 1 --sweep quick || rc=1
done
exit $rc
