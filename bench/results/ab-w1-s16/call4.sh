#!/bin/bash
# Session 16, device call 4 (issue 15; calls 2-3 of the plan in one, device time being short): the
# tree is 1afb9ef (the W = 1 decode fields first in CommParams, on top of the unit arithmetic by
# multiplies). (1) A/B at 1, 4 and 128 tokens (V3, V2-Lite), 3 rounds: `reorder` (the tree built on
# the CPU machine), `fd` (4f3048d: multiplies, old field order), `fdcg` (fd with -DEPKIT_AB_LDCG=1:
# data loads through L2 only), `prev` (2d3d76e's `roles`); (2) the full W = 1 benchmark of the tree;
# (3) make test on the tree.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
EPKIT_AB_LIBS="reorder fd fdcg prev" timeout 200 scripts/bench-ab.sh run-libs $W/ab build-gpu --reps 3 -- \
  --preset decode-v2lite,decode --tokens 1,4,128 --no-baselines > $W/ab.txt 2>&1; echo "ab rc=$?"
sed -n '/median over/,$p' $W/ab.txt
echo "ab t=$(( $(date +%s) - t0 ))"
TAIL=3 scripts/gpu-session.sh $W/s4 comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
timeout 300 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|passed|failed|Failed|\*\*\*" $W/make-test.log | tail -n 12
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "tests t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
