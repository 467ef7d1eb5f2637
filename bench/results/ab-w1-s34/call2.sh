#!/bin/bash
# Session 34, device call 2 (issue 15): the dense recv_map rows alone (call 1's token-side prefetch
# taken out again), with the dispatch's token word stored beside the slots; general kernels at W = 1
# (EPKIT_LOCAL_KERNELS=0):
# - "base": 862b9d2 (session 33's tip); tip: the tree (.ab/commit);
# - 11 rounds, V3 and V2-Lite at 1, 4, 128 tokens; stamps (the grid's last block) of both at 1 token
#   ("stbase", "st"); then make test on the tip (CPU, GPU at W = 1, 2, 4, 8 on one GPU, Python).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-570}
source scripts/ab-call-start.sh $OUT/c2
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
ab_libs general 11 150 "base" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_stages stages 40 "stbase st" --preset decode,decode-v2lite --tokens 1 --no-baselines
EPKIT_CALL_TEST_TIMEOUT=$(lim 330) source scripts/ab-call-end.sh make-test
