#!/bin/bash
# Session 22, device call 4 (issue 15): call 3's make test had one failure, NVSHMEM's heap mapping at
# start ("mapping of buffer object failed", test_all_to_all_np2_dp_2_sweep_quick, the flake
# docs/RELIABILITY.md records with 8 PEs at a time). This runs that test alone, then the GPU suite.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
(cd build-gpu && timeout 120 ctest -R '^test_all_to_all_np2_dp_2_sweep_quick$' --output-on-failure) > $W/rerun.log 2>&1
echo "rerun rc=$?"; tail -n 4 $W/rerun.log
(cd build-gpu && timeout 300 ctest -L gpu -j 8 --output-on-failure) > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?"
grep -E "tests passed|tests failed|Failed|Timeout" $W/gpu-suite.log | tail -n 8
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
