#!/bin/bash
# Session 24, device call 3 (issue 15): the session's final tree. The full W = 1 benchmark into
# bench/results/h200-w1-latest.json; the general kernels against session 23's end again (another
# machine start); the stamps with the bench matching them by name (fa4976a). Libraries built on
# the CPU machine (as in call 2):
#   base     2ea1357
#   stbase   2ea1357's dispatch/combine with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK
#   sttip    9a531ee's dispatch/combine/local, the same flags (exit stamps)
# Then make test. Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
TAIL=3 timeout 150 scripts/gpu-session.sh $W/s comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base" timeout 120 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 7 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base" timeout 80 scripts/bench-ab.sh run-libs \
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
