#!/bin/bash
# Session 15, device call 7 (issue 15): the one-warp dispatch's masked counts spread over the first
# ceil(E / 32) blocks, against `old` (the same tree with -DEPKIT_AB_TINY_BLOCK_COUNTS=1: block 0's
# count) and `tipx` (the tip built on the CPU machine), 2 rounds at 1 and 4 tokens; first the W = 1
# tests that run the one-warp dispatch (both layouts, capacity overflow included).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c7
(cd build-gpu && timeout 60 ctest -R "test_all_to_all_np1$|test_all_to_all_np1_layout_packed|test_reliability_np1" -j 3 \
  --output-on-failure) > $W/w1-tests.log 2>&1; echo "w1 tests rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*" $W/w1-tests.log | head
echo "tests t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="tipx old" timeout 60 scripts/bench-ab.sh run-libs $W/cnt build-gpu --reps 2 -- \
  --preset decode-v2lite,decode --tokens 1,4 --no-baselines > $W/cnt.txt 2>&1; echo "cnt rc=$?"
sed -n '/median over/,$p' $W/cnt.txt
echo "cnt t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c7.tgz -C $OUT c7 && rm -rf $W
