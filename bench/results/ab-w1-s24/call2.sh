#!/bin/bash
# Session 24, device call 2 (issue 15). Libraries built on the CPU machine:
#   base     2ea1357 (session 23's end; its general kernels are 616a44c's)
#   t1       60a1f4b (call 1's tip: combine without the finished-block counter)
#   stbase   2ea1357's dispatch/combine with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK
#   sttip    9a531ee's dispatch/combine/local, the same flags, with the new exit stamps
# tip = this build (9a531ee: t1 + the weights' targets of portable sources only). Then the
# W = 1 kernels' stamps (exits), and make test.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base t1" timeout 170 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 7 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base" timeout 100 scripts/bench-ab.sh run-libs \
  $W/wad build-gpu --reps 5 -- "${ARGS[@]}" --weights-at-dispatch > $W/wad.txt 2>&1; echo "wad rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/wad.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stbase sttip" timeout 100 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in stbase sttip; do echo "== $l"; grep -h "\[stages\].*mean" $W/gstages/$l-1.log | head -n 6; done
EPKIT_AB_LIBS="sttip" timeout 60 scripts/bench-ab.sh run-libs $W/lstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --stage-timers > $W/lstamps.txt 2>&1; echo "lstamps rc=$?"
echo "== local sttip"; grep -h "\[stages\].*mean" $W/lstages/sttip-1.log | head -n 6
echo "stamps t=$(( $(date +%s) - t0 ))"
source scripts/ab-call-end.sh make-test
