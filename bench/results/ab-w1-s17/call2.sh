#!/bin/bash
# Session 17, device call 2 (issue 15): the GPU suite (what make test runs on the GPU, without the
# Python suite: 326 s of device time were left) on the landing tree: the field order on the
# PieceUnits fix and the overflow test's fixed routing. Call 1's make test had 26 of 27 passing.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
(cd build-gpu && timeout 170 ctest -L gpu -j 8 --output-on-failure --timeout 150) > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?"
grep -E "tests passed|tests failed|\*\*\*|Timeout|Total Test" $W/gpu-suite.log | tail -n 10
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
