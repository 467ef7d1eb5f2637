#!/bin/bash
# Session 21, device call 2 (issue 15): the units' arithmetic by host multipliers (2f1f57b, c17ca52),
# combine's partial-row loads unconditional (decfb60), bf16 unpack by shift / mask (725b72a), against
# call 1's kept `warps`; the W = 1 kernels with and without the unpack; stage stamps of the tip in
# block 0 and in the grid's last block; make test on the tree. Libraries built on the CPU machine:
#   tip     this build (725b72a + docs)
#   loads   decfb60 (warps + div + loads)
#   div     c17ca52 (warps + both multiplier commits)
#   warps   5044e71 (call 1's kept change; the kernels of 90a187d)
#   sttip / stlast  the tip with -DEPKIT_STAGE_TIMERS, stamps of block 0 / of the last block
#                   (the bench still prints "block 0": the label is the binary's)
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="loads div warps" timeout 150 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 5 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_AB_LIBS="loads" timeout 60 scripts/bench-ab.sh run-libs $W/local build-gpu --reps 3 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines > $W/local.txt 2>&1; echo "local rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/local.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="sttip stlast" timeout 60 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in sttip stlast; do echo "== $l"; grep -h "\[stages\]" $W/gstages/$l-1.log | head -n 8; done
echo "stamps t=$(( $(date +%s) - t0 ))"
timeout 300 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
