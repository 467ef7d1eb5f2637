#!/bin/bash
# Session 23, device call 2 (issue 15): the parameter-line touch (the tip: da3d08d general kernels,
# then the local kernels) against the recv_map rows alone and session 22's end; stamps of all three;
# the GPU suite on the tip. Libraries built on the CPU machine:
#   tip      this build (touch in every kernel)
#   rows     6309477 (recv_map in message order, no touch)
#   base     616a44c
#   stbase / strows / sttouch   616a44c / 6309477 / da3d08d's dispatch and combine with
#            -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK (the bench prints "block 0")
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base rows" timeout 200 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 7 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base rows" timeout 150 scripts/bench-ab.sh run-libs \
  $W/wad build-gpu --reps 5 -- "${ARGS[@]}" --weights-at-dispatch > $W/wad.txt 2>&1; echo "wad rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/wad.txt
EPKIT_AB_LIBS="rows" timeout 150 scripts/bench-ab.sh run-libs \
  $W/local build-gpu --reps 7 -- "${ARGS[@]}" > $W/local.txt 2>&1; echo "local rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/local.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stbase strows sttouch" timeout 100 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in stbase strows sttouch; do echo "== $l"; grep -h "\[stages\].*mean" $W/gstages/$l-1.log | head -n 4; done
echo "stamps t=$(( $(date +%s) - t0 ))"
(cd build-gpu && timeout 200 ctest -L gpu -j 8 --output-on-failure) > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" $W/gpu-suite.log | tail -n 8
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
