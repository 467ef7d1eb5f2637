#!/bin/bash
# Session 16, device call 3 (issue 15): (1) the W = 1 tests with the unit arithmetic by multiplies
# (small_div: a unit's token, piece and k, the one-wave combine's token) and the map unit's weights
# loaded with the indices; (2) A/B at 1, 4 and 128 tokens (V3, V2-Lite), 3 rounds: `fd` (the tree
# built on the CPU machine), `fdcg` (the same with -DEPKIT_AB_LDCG=1: data loads through L2 only),
# `prev` (call 2's `roles`, the tree before).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
(cd build-gpu && timeout 120 ctest -R "test_all_to_all_np1|test_reliability_np1_stress_500|test_moe_layer_np1" -j 4 \
  --output-on-failure) > $W/w1-tests.log 2>&1; echo "w1 tests rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Passed" $W/w1-tests.log | head -n 12
echo "tests t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="prev fd fdcg" timeout 200 scripts/bench-ab.sh run-libs $W/ab build-gpu --reps 3 -- \
  --preset decode-v2lite,decode --tokens 1,4,128 --no-baselines > $W/ab.txt 2>&1; echo "ab rc=$?"
sed -n '/median over/,$p' $W/ab.txt
echo "ab t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $W
