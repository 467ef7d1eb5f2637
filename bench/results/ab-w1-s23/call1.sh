#!/bin/bash
# Session 23, device call 1 (issue 15): combine's first loads at the kernel's start. Libraries built
# on the CPU machine:
#   tip      this build (ee80774: recv_map in message order + the token side's index preload)
#   rows     340e7f4 (recv_map in message order only)
#   base     616a44c (session 22's end)
#   stbase   616a44c's dispatch/combine with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK
#   sttip    ee80774's, the same flags (the bench prints "block 0" for both)
# Then make test on the tree. Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base rows" timeout 200 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 7 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="base" timeout 100 scripts/bench-ab.sh run-libs \
  $W/wad build-gpu --reps 3 -- "${ARGS[@]}" --weights-at-dispatch > $W/wad.txt 2>&1; echo "wad rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/wad.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stbase sttip" timeout 100 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in stbase sttip; do echo "== $l"; grep -h "\[stages\].*mean" $W/gstages/$l-1.log | head -n 4; done
echo "stamps t=$(( $(date +%s) - t0 ))"
timeout 300 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
