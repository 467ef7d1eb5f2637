#!/bin/bash
# Session 27, device call 6: the final tree (call 3's kernels plus the send half's stamps, which
# only stamps builds compile, and three more stage slots in DeviceState): the GPU suite, and the
# full W = 1 benchmark (h200-w1-latest.json).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest"].
set -u
source scripts/ab-call-start.sh $OUT/c6
ab_gpu_suite 170
timeout $(lim 40) scripts/gpu-session.sh $W/s comm-w1 > $W/comm-w1.txt 2>&1; echo "comm-w1 rc=$?"
cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
source scripts/ab-call-end.sh
