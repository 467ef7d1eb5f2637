#!/bin/bash
# Session 22, device call 5 (issue 15): the bench's stage stamps with the mean beside the median
# (%globaltimer steps; see print_stage_times), the tip's last-block stamps library (stlast: the
# kernels of b86cf57 with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK; the bench prints "block 0").
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c5
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stlast" timeout 90 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/stlast-1.log | head -n 12
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c5.tgz -C $OUT c5 && rm -rf $W
