#!/bin/bash
# Session 21, device call 4 (issue 15): make test on the final tree (the review's refactor of the
# receive copy's entry arithmetic, after call 2's make test).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
timeout 300 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
