#!/bin/bash
# Session 25, device call 2 (issue 15). Libraries built on the CPU machine (prepare-lib NAME .):
#   prev    ab98c07's combine (call 1's tip: rows first, each warp's own message index)
#   stprev  prev's dispatch/combine with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK (call 1's sttip)
#   sttok   the tip's, the same flags
# tip = this build (fb408bb: prev + the token side on the warps combine_send leaves free). The GPU
# suite on the tip first, then the general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0) against prev,
# the stamps, and the full W = 1 benchmark (bench/results/h200-w1-latest.json), each step bounded
# by what is left of the call. Carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
lim() { local l=$(( 570 - ($(date +%s) - t0) )); [ $l -lt $1 ] && echo $l || echo $1; }  # lim MAX
(cd build-gpu && timeout $(lim 200) ctest -L gpu -j 8 --output-on-failure) > "$W/gpu-suite.log" 2>&1
echo "gpu suite rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" "$W/gpu-suite.log" | tail -n 8
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="prev" timeout $(lim 130) scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 9 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="prev" timeout $(lim 80) scripts/bench-ab.sh run-libs \
  $W/wad build-gpu --reps 5 -- "${ARGS[@]}" --weights-at-dispatch > $W/wad.txt 2>&1; echo "wad rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/wad.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stprev sttok" timeout $(lim 50) scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in stprev sttok; do echo "== $l"; grep -h "\[stages\].*mean" $W/gstages/$l-1.log | head -n 6; done
TAIL=3 timeout $(lim 60) scripts/gpu-session.sh $W/s comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
source scripts/ab-call-end.sh
