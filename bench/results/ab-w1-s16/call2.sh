#!/bin/bash
# Session 16, device call 2 (issue 15): (1) the W = 1 tests with the one-warp dispatch's bookkeeping
# on warps of its own (EPKIT_LOCAL_TINY_ROLES, the tree's default now); (2) A/B at 1 and 4 tokens
# (V3, V2-Lite), 3 rounds: `roles` (the tree), `old` (the same tree with
# -DEPKIT_LOCAL_TINY_ROLES=0), `tipx` (call 1's CPU-built tip), and the combine's diagnostic
# libraries of cdiag.patch (never landed; their outputs are wrong by design): `cnm` no recv_map
# load (rows from the token and k), `cnw` no weight load, `cnmw` neither, `cny` no expert_y loads.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
(cd build-gpu && timeout 120 ctest -R "test_all_to_all_np1|test_reliability_np1_stress_500|test_moe_layer_np1" -j 4 \
  --output-on-failure) > $W/w1-tests.log 2>&1; echo "w1 tests rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Passed" $W/w1-tests.log | head -n 12
echo "tests t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="tipx old roles cnm cnw cnmw cny" timeout 240 scripts/bench-ab.sh run-libs $W/ab build-gpu --reps 3 -- \
  --preset decode-v2lite,decode --tokens 1,4 --no-baselines > $W/ab.txt 2>&1; echo "ab rc=$?"
sed -n '/median over/,$p' $W/ab.txt
echo "ab t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
