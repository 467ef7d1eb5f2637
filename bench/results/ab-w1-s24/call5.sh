#!/bin/bash
# Session 24, device call 5 (issue 15): the stamps again with each call gated (this build's
# epkit-bench, d7807c2 + the gate), to see the kernels' boundary without the host's launch time.
# Libraries (as in call 4, plus call 2's general stamps library):
#   sttouch    d7807c2, -DEPKIT_STAGE_TIMERS (block 0 stamps)
#   stnotouch  d7807c2, -DEPKIT_STAGE_TIMERS -DEPKIT_PARAM_TOUCH=0
#   stgen      9a531ee's dispatch/combine/local, -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c5
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --stage-timers)
EPKIT_AB_LIBS="sttouch stnotouch" timeout 80 scripts/bench-ab.sh run-libs $W/lstages build-gpu --reps 1 -- \
  "${ARGS[@]}" > $W/lstamps.txt 2>&1; echo "lstamps rc=$?"
for l in sttouch stnotouch; do echo "== local $l"; grep -h "\[stages\].*mean" $W/lstages/$l-1.log | head -n 6; done
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stgen sttouch" timeout 80 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  "${ARGS[@]}" > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in stgen sttouch; do echo "== general $l"; grep -h "\[stages\].*mean" $W/gstages/$l-1.log | head -n 6; done
source scripts/ab-call-end.sh none
