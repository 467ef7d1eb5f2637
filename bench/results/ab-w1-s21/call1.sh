#!/bin/bash
# Session 21, device call 1 (issue 15): combine's chores off the first partial's warp (5044e71), the
# token side's first index at the start (20bde75), dispatch's data wait beside the offsets
# (105fb7c), against the session's start; stage stamps of base and tip; a per-instruction profile of
# the fused dispatch and combine at V3, 1 token (Nsight Compute SourceCounters: counts and stall
# samples); make test on the tree. General kernels at W = 1 (EPKIT_LOCAL_KERNELS=0). Libraries built
# on the CPU machine:
#   tip     this build (105fb7c)
#   first   20bde75 (warps + first)
#   warps   5044e71
#   base    aab1b00 (the session's start)
#   sttip / stbase  tip / base with -DEPKIT_STAGE_TIMERS
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="first warps base" timeout 150 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 5 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stbase sttip" timeout 60 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in stbase sttip; do echo "== $l"; grep -h "\[stages\]" $W/gstages/$l-1.log | head -n 8; done
echo "stamps t=$(( $(date +%s) - t0 ))"
# The fused pair: the first warm-up's launches alternate dispatch, combine (the split halves come later).
EPKIT_LOCAL_KERNELS=0 timeout 150 ncu --clock-control none --target-processes all \
  --kernel-name regex:"dispatch_kernel|combine_kernel" --launch-skip 10 --launch-count 2 \
  --section SourceCounters --section LaunchStats --section WarpStateStats -o $W/prof \
  build-gpu/bin/epkit-run -n 1 -- build-gpu/bin/epkit-bench --preset decode --tokens 1 --no-baselines > $W/ncu.log 2>&1
echo "ncu rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 4 $W/ncu.log
if [ -f $W/prof.ncu-rep ]; then
  timeout 60 ncu --import $W/prof.ncu-rep --page source --csv --print-source sass > $W/prof-sass.csv 2> $W/prof-sass.err
  echo "source page rc=$? lines=$(wc -l < $W/prof-sass.csv)"; head -3 $W/prof-sass.err
  timeout 30 ncu --import $W/prof.ncu-rep --page details --csv > $W/prof-details.csv 2>/dev/null
  xz -6 $W/prof-sass.csv
fi
timeout 300 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout|^== |passed|failed" $W/make-test.log | tail -n 16
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "end t=$(( $(date +%s) - t0 ))"
rm -f $W/prof.ncu-rep
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
