#!/bin/bash
# Session 38, device call 1 (issue 15). The tree (.ab/commit, "tip") against:
# - "base" (-DEPKIT_AB_ABORT_AT_LOAD -DEPKIT_AB_M_TWICE): the parent's kernels. dispatch_recv's thread 0
#   tests the abort flag where it loads it (SASS: the test sat in the load's basic block, so the
#   thread waited out the round trip before its offsets), and combine_recv loads m again;
# - "abonly" (-DEPKIT_AB_M_TWICE): the abort-flag change alone (m on the host: the same kernels as tip).
# Steps: general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), m on the host (12 rounds) and on the device
# (--device-m, 8 rounds: the path of a graph that serves any m, where the second m load was a round
# trip on the token side's chain); block 0's stamps with the detail stamps (-DEPKIT_STAGE_DETAIL) of
# base and tip, m on the host and on the device; make test.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-575}
source scripts/ab-call-start.sh $OUT/c1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
ab_libs general 12 150 "base" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_libs devm 8 120 "base abonly" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --device-m
ab_stages stages0 40 "stbase0 st0" --preset decode,decode-v2lite --tokens 1 --no-baselines
ab_stages stages0d 40 "stbase0 st0" --preset decode,decode-v2lite --tokens 1 --no-baselines --device-m
EPKIT_CALL_TEST_TIMEOUT=$(lim 240) source scripts/ab-call-end.sh make-test
