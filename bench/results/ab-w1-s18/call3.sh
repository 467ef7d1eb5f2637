#!/bin/bash
# Session 18, device call 3 (issue 15, EP2 goal): dispatch's messages as tagged words (8324021) on
# top of call 2's tree. A/B at W = 1 with EPKIT_LOCAL_KERNELS=0, libraries built on the CPU machine:
#   tipx      the tree (no flags)
#   msgflag   -DEPKIT_AB_FLAGGED_MSGS: messages with arrival counters (call 2's tip)
#   base      main before this session (a86f625)
#   stages    the tree with -DEPKIT_STAGE_TIMERS
# Then a 128-token object's 1-token call, the stamps and make test (CPU, GPU at W = 1..8, Python).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="tipx msgflag base" timeout 150 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 3 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="msgflag base" timeout 60 scripts/bench-ab.sh run-libs $W/m128 build-gpu --reps 2 -- \
  --preset decode,decode-v2lite --tokens 1 --max-tokens 128 --no-baselines > $W/m128.txt 2>&1; echo "m128 rc=$?"
sed -n '/median over/,$p' $W/m128.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stages" timeout 40 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/stages-1.log | head -n 40
echo "stamps t=$(( $(date +%s) - t0 ))"
timeout 330 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $W
