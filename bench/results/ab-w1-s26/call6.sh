#!/bin/bash
# Session 26, device call 6: call 5's GPU suite stopped test_all_to_all_np2_dp_1_portable_sweep_quick
# at NVSHMEM's start ("mapping of buffer object failed", init.cu:858, before any epkit code: the
# heap-mapping flake of docs/RELIABILITY.md). The portable tests again, alone, on the final tree.
set -u
source scripts/ab-call-start.sh $OUT/c6
(cd build-gpu && timeout $(lim 150) ctest -R "portable" --output-on-failure) > "$W/portable.log" 2>&1
echo "portable rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|Passed" "$W/portable.log" | tail -n 8
source scripts/ab-call-end.sh
