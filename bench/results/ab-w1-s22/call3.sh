#!/bin/bash
# Session 22, device call 3 (issue 15): dispatch's release to ourselves at GPU scope (the tip)
# against 222b301 (the one pass reverted, so the only kernel difference); the tip's last-block
# stamps; make test on the tree. Libraries built on the CPU machine:
#   tip     this build
#   base    222b301 (calls 1-2's library)
#   stlast  the tip with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK (the bench prints "block 0")
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base" timeout 150 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 7 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stlast" timeout 60 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/stlast-1.log | head -n 8
echo "stamps t=$(( $(date +%s) - t0 ))"
timeout 300 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $W
