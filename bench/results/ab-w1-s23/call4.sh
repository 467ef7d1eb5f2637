#!/bin/bash
# Session 23, device call 4 (issue 15): the GPU suite on the final tree (the general kernels of
# 616a44c again, the W = 1 kernels with the parameter-line touch). No libraries carried.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
(cd build-gpu && timeout 170 ctest -L gpu -j 8 --output-on-failure) > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" $W/gpu-suite.log | tail -n 8
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
