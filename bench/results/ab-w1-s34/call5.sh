#!/bin/bash
# Session 34, device call 5 (issue 15), on the H100 that call 4 got (call 4 asked for an H200 for the
# W = 1 run of bench/results/h200-w1-latest.json and stopped at once on this H100): call 3's A/B
# once more with more rounds, "base" 862b9d2 (session 33's tip) against the tree (.ab/commit),
# general kernels at W = 1, 21 rounds.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-300}
source scripts/ab-call-start.sh $OUT/c5
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
ab_libs general 21 200 "base" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
source scripts/ab-call-end.sh
