#!/bin/bash
# Session 16, device call 5 (issue 15): make test on the landing tree (the multiplies of 4f3048d,
# without call 4's field reorder, reverted in cd89b5f, and without the A/B switches), then the full
# W = 1 benchmark of that tree.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c5
timeout 300 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|passed|failed|Failed|\*\*\*" $W/make-test.log | tail -n 12
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "tests t=$(( $(date +%s) - t0 ))"
TAIL=3 scripts/gpu-session.sh $W/s5 comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c5.tgz -C $OUT c5 && rm -rf $W
