#!/bin/bash
# Session 33, device call 2 (issue 15): the decode send half with the three warp matches only in
# the warps that use them (expert count warps count by shuffles), general kernels at W = 1
# (EPKIT_LOCAL_KERNELS=0):
# - "base": 436d24f (call 1's kernels); tip: the tree (.ab/commit);
# - 7 rounds, V3 and V2-Lite at 1, 4, 128 tokens; then stamps of the sending block (the grid's last
#   block) of both at 1 token ("stbase", "st"); then the GPU suite on the tip (W = 1, 2, 4, 8).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-300}
source scripts/ab-call-start.sh $OUT/c2
ab_libs general 7 120 "base" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_stages stages 40 "stbase st" --preset decode,decode-v2lite --tokens 1 --no-baselines
EPKIT_CALL_TEST_TIMEOUT=150 source scripts/ab-call-end.sh gpu-suite
