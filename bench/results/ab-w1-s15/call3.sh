#!/bin/bash
# Session 15, device call 3: the launch probe again with the instruction-fetch cases (two-trip
# kernel after 256-2048 multiply-adds: straight-line, in a loop, or branched over), and the full
# W = 1 benchmark at the landing tree.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
NVCC=$(sed -n 's|^CMAKE_CUDA_COMPILER:[A-Z]*=||p' build-gpu/CMakeCache.txt)
$NVCC -O2 -std=c++17 -arch=sm_90a -I src -o $W/launch_probe bench/results/ab-w1-s15/launch_probe.cu > $W/probe-build.log 2>&1 \
  && timeout 90 $W/launch_probe > $W/launch-probe.txt 2>&1; echo "probe rc=$?"
cat $W/launch-probe.txt; rm -f $W/launch_probe
echo "probe t=$(( $(date +%s) - t0 ))"
TAIL=3 scripts/gpu-session.sh $W/s3 comm-w1; cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $W
