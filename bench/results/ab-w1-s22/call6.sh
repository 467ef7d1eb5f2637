#!/bin/bash
# Session 22, device call 6 (issue 15): the GPU suite on the final tree (the review's release loop:
# one place for every counter the block adds to, GPU scope to our own).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c6
(cd build-gpu && timeout 240 ctest -L gpu -j 8 --output-on-failure) > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?"
grep -E "tests passed|tests failed|Failed|Timeout" $W/gpu-suite.log | tail -n 8
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c6.tgz -C $OUT c6 && rm -rf $W
