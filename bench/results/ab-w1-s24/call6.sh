#!/bin/bash
# Session 24, device call 6 (issue 15): the parameter-line touch in the general kernels again, now
# that the combine kernel's blocks no longer meet at the end. Library built on the CPU machine:
#   gtouch   this tree (see .ab/commit) with -DEPKIT_GENERAL_TOUCH=1 (dispatch, combine, local)
# tip = this build (no touch in the general kernels). The last of the session's device time: no tests.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c6
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="gtouch" timeout 100 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 7 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
source scripts/ab-call-end.sh none
