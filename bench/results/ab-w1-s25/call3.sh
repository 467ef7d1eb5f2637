#!/bin/bash
# Session 25, device call 3 (issue 15). Libraries built on the CPU machine (prepare-lib NAME .):
#   prev    ab98c07's combine (call 1's tip)
#   tokl    the tip + fb408bb's token side on free warps (reverted after call 2), re-applied
#   stprev  prev's dispatch/combine with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK
#   stpoll  the tip's, the same flags;  sttokl  tokl's, the same flags
# tip = this build (8b0341d: prev + the token side's one-lane poll before every lane checks its
# chunks). Question: did call 2's free-warp token side lose to its spinning lanes (then tokl
# wins or ties), and does the one-lane poll help where the token side is now? The GPU suite on the
# tip first, then the general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), each step bounded by what is
# left of the call. Carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
lim() { local l=$(( 570 - ($(date +%s) - t0) )); [ $l -lt $1 ] && echo $l || echo $1; }  # lim MAX
(cd build-gpu && timeout $(lim 200) ctest -L gpu -j 8 --output-on-failure) > "$W/gpu-suite.log" 2>&1
echo "gpu suite rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" "$W/gpu-suite.log" | tail -n 8
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="prev tokl" timeout $(lim 170) scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 7 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stprev stpoll sttokl" timeout $(lim 60) scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in stprev stpoll sttokl; do echo "== $l"; grep -h "\[stages\].*mean" $W/gstages/$l-1.log | head -n 4; done
source scripts/ab-call-end.sh
