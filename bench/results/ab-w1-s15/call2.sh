#!/bin/bash
# Session 15, device call 2: make test after the harness and Python-suite changes (LastTest.log
# kept for the per-case times), then the launch probe (launch_probe.cu: the harness floor's parts).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
timeout 400 scripts/run-tests.sh build-gpu > $W/make-test.log 2>&1; echo "make test rc=$?"
grep -E "tests passed|tests failed|\*\*\*|^== |[0-9]+ passed|[0-9]+ failed" $W/make-test.log | head -20
cp build-gpu/Testing/Temporary/LastTest.log $W/ 2>/dev/null
echo "tests t=$(( $(date +%s) - t0 ))"
NVCC=$(sed -n 's|^CMAKE_CUDA_COMPILER:[A-Z]*=||p' build-gpu/CMakeCache.txt)
$NVCC -O2 -std=c++17 -arch=sm_90a -I src -o $W/launch_probe bench/results/ab-w1-s15/launch_probe.cu > $W/probe-build.log 2>&1 \
  && timeout 60 $W/launch_probe > $W/launch-probe.txt 2>&1; echo "probe rc=$?"
cat $W/launch-probe.txt; rm -f $W/launch_probe
echo "probe t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $W
