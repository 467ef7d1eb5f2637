#!/bin/bash
# Session 34, device call 1 (issue 15): the general combine's dependent loads, general kernels at
# W = 1 (EPKIT_LOCAL_KERNELS=0):
# - "base": 862b9d2 (session 33's tip); "A": 14c7d09 (the token side's first expert indices loaded
#   at the kernel's start); tip: the tree (.ab/commit: A + dense recv_map rows, the decode path's
#   first row loaded before the message counts);
# - 7 rounds, V3 and V2-Lite at 1, 4, 128 tokens; then stamps (the grid's last block) of base and
#   tip at 1 token ("stbase", "st"); then the GPU suite on the tip (W = 1, 2, 4, 8).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-560}
source scripts/ab-call-start.sh $OUT/c1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
EPKIT_CALL_TEST_TIMEOUT=150 ab_gpu_suite 150
ab_libs general 7 230 "base A" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_stages stages 50 "stbase st" --preset decode,decode-v2lite --tokens 1 --no-baselines
source scripts/ab-call-end.sh
