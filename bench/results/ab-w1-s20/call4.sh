#!/bin/bash
# Session 20, device call 4 (issue 15): the DP group index and / D multiplier from the host
# (0efb846) against the tree before it; then make test on the tree. General kernels at W = 1
# (EPKIT_LOCAL_KERNELS=0), libraries built on the CPU machine:
#   tip   this build
#   skip  bc0caf4: call 3's tip (the skipped histogram steps)
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="skip" timeout 120 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 7 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
timeout 300 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $W
