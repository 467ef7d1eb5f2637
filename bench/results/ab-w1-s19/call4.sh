#!/bin/bash
# Session 19, device call 4: the GPU suite (W = 1..8, several PEs on the GPU; the portable-path runs
# at W = 2 and 4) on the tree where decode objects whose ranks do not all map every peer (or that
# force the portable path) keep single-width combine_recv rows: the ranks agree on P2P before the
# symmetric allocation. Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
(cd build-gpu && timeout 200 ctest -L gpu -j 8 --output-on-failure) > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|Total Test" $W/gpu-suite.log | tail -n 14
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
