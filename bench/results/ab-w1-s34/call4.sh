#!/bin/bash
# Session 34, device call 4 (issue 15), on an H200 only (it stops at once on another GPU): the W = 1
# run of the tip (local kernels, both layouts, NCCL and NVSHMEM baselines:
# bench/results/h200-w1-latest.json), then calls 2-3's A/B on this GPU: "base" 862b9d2 (session
# 33's tip) against the tree (.ab/commit), general kernels at W = 1, 11 rounds.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; exit 0; }
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-300}
source scripts/ab-call-start.sh $OUT/c4
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
PHASE_TIMEOUT=$(lim 90) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
ab_libs general 11 120 "base" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
source scripts/ab-call-end.sh
