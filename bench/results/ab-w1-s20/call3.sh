#!/bin/bash
# Session 20, device call 3 (issue 15): the histogram's empty steps skipped (70c22de), against the
# tree before it and main before the session; a per-instruction profile of the general kernels at
# 1 token (Nsight Compute, SourceCounters); the full W = 1 benchmark and make test on the tree.
# Libraries built on the CPU machine:
#   tip     this build
#   noskip  bffc540: seq + hist (the tail reverted), no skip
#   base    call 1's `base` (a017a9f)
#   sttip2  the tip with -DEPKIT_STAGE_TIMERS
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="noskip base" timeout 120 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 5 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="sttip2" timeout 40 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
grep -h "\[stages\]" $W/gstages/sttip2-1.log | head -n 8
echo "stamps t=$(( $(date +%s) - t0 ))"
# Per-instruction execution counts of one dispatch and one combine launch at V3 1 token.
ncu --version | tail -1
EPKIT_LOCAL_KERNELS=0 timeout 150 ncu --clock-control none --target-processes all \
  --kernel-name regex:"dispatch_kernel|combine_kernel" --launch-skip 200 --launch-count 2 \
  --section SourceCounters --section LaunchStats -o $W/prof1 \
  build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench --preset decode --tokens 1 --no-baselines > $W/ncu.log 2>&1
echo "ncu rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 4 $W/ncu.log
if [ -f $W/prof1.ncu-rep ]; then
  timeout 60 ncu --import $W/prof1.ncu-rep --page source --csv --print-source sass > $W/prof1-sass.csv 2> $W/prof1-sass.err
  echo "source page rc=$? lines=$(wc -l < $W/prof1-sass.csv)"; head -c 600 $W/prof1-sass.csv; head -3 $W/prof1-sass.err
fi
TAIL=3 timeout 70 scripts/gpu-session.sh $W/s comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
timeout 300 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $W
