#!/bin/bash
# Session 16, device call 1 (issue 15): (1) the carveout probe (does a change of the SM's L1 /
# shared-memory split between two kernels cost the event-timed pair?); (2) the same question in the
# library: `cv1` = the combine asks for the dispatch's dynamic shared memory, `cv2` = every local
# kernel prefers the largest shared-memory carveout, against `tipx` (the tip built on the CPU
# machine), 3 rounds; (3) `make test` on the tip (the review commits a5d8152 and b424464 of
# session 15 had not run on a GPU).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
NVCC=$(sed -n 's|^CMAKE_CUDA_COMPILER:[A-Z]*=||p' build-gpu/CMakeCache.txt)
$NVCC -O2 -std=c++17 -arch=sm_90a -o $W/carveout_probe bench/results/ab-w1-s16/carveout_probe.cu > $W/probe-build.log 2>&1 \
  && timeout 60 $W/carveout_probe > $W/carveout-probe.txt 2>&1; echo "probe rc=$?"
grep -v "^$" $W/carveout-probe.txt; tail -n 3 $W/probe-build.log; rm -f $W/carveout_probe
echo "probe t=$(( $(date +%s) - t0 ))"
EPKIT_AB_LIBS="tipx cv1 cv2" timeout 150 scripts/bench-ab.sh run-libs $W/cv build-gpu --reps 3 -- \
  --preset decode-v2lite,decode --tokens 1,4,128 --no-baselines > $W/cv.txt 2>&1; echo "cv rc=$?"
sed -n '/median over/,$p' $W/cv.txt
echo "cv t=$(( $(date +%s) - t0 ))"
timeout 330 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|passed|failed|Failed|\*\*\*|SKIP" $W/make-test.log | tail -n 15
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "tests t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $W
