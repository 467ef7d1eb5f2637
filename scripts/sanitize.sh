#!/usr/bin/env bash
# compute-sanitizer over the GPU suite on a reduced config (issue #6).
# Usage: scripts/sanitize.sh BUILD_DIR [memcheck|racecheck|synccheck ...]
# Each tool runs the split-phase test (dispatch_send / foreign kernel / dispatch_recv / combine)
# at 2 ranks; kernels run far slower under the tools, hence the long device-side timeout.
set -uo pipefail
BUILD=${1:?usage: scripts/sanitize.sh BUILD_DIR [tool...]}; shift
TOOLS=("${@:-memcheck}")
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 EPKIT_TIMEOUT_MS=${EPKIT_TIMEOUT_MS:-120000}
rc=0
for tool in "${TOOLS[@]}"; do
  echo "== compute-sanitizer --tool $tool"
  "$BUILD/bin/epkit-run" -n 2 -- compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
    "$BUILD/tests/gpu/test_all_to_all" --gtest_filter='*SplitPhases*' --dp 1 || rc=1
done
exit $rc
