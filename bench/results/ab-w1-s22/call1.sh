#!/bin/bash
# Session 22, device call 1 (issue 15): dispatch's one-pass send (e062ad9) against the session's
# start (222b301), the general kernels at W = 1; the last block's stage stamps of the one pass; make
# test on the tree. Libraries built on the CPU machine:
#   tip     this build (e062ad9 + the call's script)
#   base    222b301 (session 21's end)
#   stlast  the tip with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK: stamps of the grid's last
#           block, which holds the 1-token call's token (the bench still prints "block 0")
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base" timeout 150 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 5 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stlast" timeout 60 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/stlast-1.log | head -n 8
echo "stamps t=$(( $(date +%s) - t0 ))"
timeout 300 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
