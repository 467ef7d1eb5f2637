#!/bin/bash
# Session 17, device call 2 (issue 15): make test on the landing tree (the field order on the
# PieceUnits fix, the overflow test's fixed routing), nothing else. Call 1's make test was cut by its
# own 250 s limit in the Python suite, after 26 of 27 GPU tests passed.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
timeout 330 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|== |passed|failed" $W/make-test.log | grep -v Warning | tail -n 14
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
