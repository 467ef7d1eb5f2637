#!/bin/bash
# Session 18, device call 2 (issue 15, EP2 goal): tagged partials (596cc2e) on top of call 1's spread,
# the call-1 switches removed. A/B at W = 1 with EPKIT_LOCAL_KERNELS=0, libraries built on the CPU machine:
#   tipx      the tree (no flags)
#   flagged   -DEPKIT_AB_FLAGGED_PARTIALS: partials with arrival flags (call 1's tip, rows 2x apart)
#   base      main before this session (a86f625)
#   stages    the tree with -DEPKIT_STAGE_TIMERS
# Then objects of 128 and 512 tokens with a 1-token call (512: M > 256, flags), the stamps, the full
# W = 1 benchmark (local kernels), and make test (CPU, GPU at W = 1..8, Python).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="tipx flagged base" timeout 150 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 3 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
for M in 128 512; do
  EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="flagged base" timeout 60 scripts/bench-ab.sh run-libs $W/m$M build-gpu --reps 2 -- \
    --preset decode,decode-v2lite --tokens 1 --max-tokens $M --no-baselines > $W/m$M.txt 2>&1; echo "m$M rc=$?"
  sed -n '/median over/,$p' $W/m$M.txt
done
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stages" timeout 40 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/stages-1.log | head -n 40
echo "stamps t=$(( $(date +%s) - t0 ))"
TAIL=3 timeout 60 scripts/gpu-session.sh $W/s comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
timeout 330 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
