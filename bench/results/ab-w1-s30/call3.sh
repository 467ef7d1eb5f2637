#!/bin/bash
# Session 30, device call 3 (calls 1 and 2 of this session are s29's call 2, bench/results/ab-w1-s29/):
# the decode kernels of the general pair, step by step, general kernels at W = 1
# (EPKIT_LOCAL_KERNELS=0), 9 rounds in one process per library:
# - "base": 2cd7fde (a41e2fc's kernels: before both decode kernels);
# - "cdec": 5267051 (combine's decode kernel, 88f5741);
# - tip: also dispatch's decode kernel (one own token per sending block; 2752 -> 2456 SASS instructions).
# Then the GPU suite on the tip (W = 1, 2, 4, 8 on one GPU), and the W = 1 run of the tip
# (bench/results/h200-w1-latest.json; the W = 1 kernels are a86d186's).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
ab_libs general 9 150 "base cdec" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_gpu_suite 200
PHASE_TIMEOUT=$(lim 200) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
source scripts/ab-call-end.sh
