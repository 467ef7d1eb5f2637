#!/bin/bash
# Session 24, device call 4 (issue 15): the W = 1 kernels' parameter-line touch, event-timed and
# stamped, after call 3's stamps showed 2.2 us from their dispatch's exit to their combine's first
# stamp at 1 token (1.0 in the general kernels, which have no touch). Libraries built on the CPU
# machine from this tree (d7807c2):
#   notouch    -DEPKIT_PARAM_TOUCH=0
#   sttouch    -DEPKIT_STAGE_TIMERS (block 0 stamps; dispatch, combine and local)
#   stnotouch  -DEPKIT_STAGE_TIMERS -DEPKIT_PARAM_TOUCH=0
# tip = this build (the touch, as landed). No tests: the tree's normal build is call 3's.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_AB_LIBS="notouch" timeout 120 scripts/bench-ab.sh run-libs \
  $W/local build-gpu --reps 9 -- "${ARGS[@]}" > $W/local.txt 2>&1; echo "local rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/local.txt
EPKIT_AB_LIBS="sttouch stnotouch" timeout 100 scripts/bench-ab.sh run-libs $W/lstages build-gpu --reps 1 -- \
  "${ARGS[@]}" --stage-timers > $W/lstamps.txt 2>&1; echo "lstamps rc=$?"
for l in sttouch stnotouch; do echo "== $l"; grep -h "\[stages\].*mean" $W/lstages/$l-1.log | head -n 6; done
echo "stamps t=$(( $(date +%s) - t0 ))"
source scripts/ab-call-end.sh none
