#!/bin/bash
# Session 25, device call 1 (issue 15, the general kernels' combine). Libraries built on the CPU
# machine with scripts/bench-ab.sh prepare-lib NAME . (the working tree's combine.cu as named):
#   base    5a900cf's combine (session 24's kernels; only comments and stamp builds changed)
#   rows    fbac620 + ab98c07's guard: the first rows' loads before the weights' wait
#   stbase  base's dispatch/combine with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK
#   sttip   the tip's (ab98c07), the same flags
# tip = this build (ab98c07: rows + each warp's own message index, no block barrier before the
# partials in the small P2P variant). make test first (its GPU suite runs the general kernels at
# W = 2, 4, 8 with several PEs on the GPU), then the general kernels at W = 1
# (EPKIT_LOCAL_KERNELS=0), each step bounded by what is left of the call.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
lim() { local l=$(( 570 - ($(date +%s) - t0) )); [ $l -lt $1 ] && echo $l || echo $1; }  # lim MAX
timeout $(lim 260) scripts/run-tests.sh build-gpu > "$W/make-test.log" 2>&1
echo "make test rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" "$W/make-test.log" | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log "$W/" 2>/dev/null
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base rows" timeout $(lim 170) scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 7 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base" timeout $(lim 90) scripts/bench-ab.sh run-libs \
  $W/wad build-gpu --reps 5 -- "${ARGS[@]}" --weights-at-dispatch > $W/wad.txt 2>&1; echo "wad rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/wad.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stbase sttip" timeout $(lim 60) scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in stbase sttip; do echo "== $l"; grep -h "\[stages\].*mean" $W/gstages/$l-1.log | head -n 6; done
source scripts/ab-call-end.sh
