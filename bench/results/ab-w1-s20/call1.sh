#!/bin/bash
# Session 20, device call 1 (issue 15, EP2 goal): three changes to the general kernels' first
# instructions, each its own commit, measured incrementally at W = 1 (EPKIT_LOCAL_KERNELS=0),
# libraries built on the CPU machine:
#   base    main before the session (a017a9f)
#   seq     31cbccd: DeviceState::seq holds the next call's number (no add right after the load)
#   hist    0868701: + the dispatch's first top-k loads before the histogram's zeroing, no divisions
#   tip     this build (097e47a): + the combine's layer tail by cp.async into shared memory
#   stbase / sttip  base and tip with -DEPKIT_STAGE_TIMERS
# Then the GPU suite on the tip (W = 1..8; also the first GPU run of a017a9f's host change).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="hist seq base" timeout 210 scripts/bench-ab.sh run-libs \
  $W/gen build-gpu --reps 3 -- "${ARGS[@]}" > $W/gen.txt 2>&1; echo "gen rc=$? t=$(( $(date +%s) - t0 ))"
sed -n '/median over/,$p' $W/gen.txt
EPKIT_LOCAL_KERNELS=0 EPKIT_AB_LIBS="stbase sttip" timeout 60 scripts/bench-ab.sh run-libs $W/gstages build-gpu --reps 1 -- \
  --preset decode,decode-v2lite --tokens 1,128 --no-baselines --stage-timers > $W/gstamps.txt 2>&1; echo "gstamps rc=$?"
for l in stbase sttip; do echo "== $l"; grep -h "\[stages\]" $W/gstages/$l-1.log | head -n 8; done
echo "stamps t=$(( $(date +%s) - t0 ))"
(cd build-gpu && timeout 200 ctest -L gpu -j 8 --output-on-failure) > $W/gpu-suite.log 2>&1; echo "gpu suite rc=$?"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" $W/gpu-suite.log | tail -n 12
echo "end t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
