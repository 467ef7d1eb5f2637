#!/bin/bash
# Session 26, device call 4 (issue 15, the general kernels: tagged dispatch messages only between
# pairs with at most 32 messages in the call). Library built on the CPU machine with
# scripts/bench-ab.sh prepare-lib NAME . :
#   prev     777f861 (call 2's tip: no tagged messages)
# tip = this build (54f9f97: tagged messages where a pair has <= kTaggedMsgMaxMsgs = 32 messages).
# The GPU suite first (W = 2, 4, 8 with several PEs on the GPU: objects of M <= 256 whose calls
# mix tagged and counted pairs), then the general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0) at the
# sizes around the threshold (at W = 1 a call of m tokens sends m messages to itself).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
ab_gpu_suite 200
ab_libs v3 5 230 "prev" --preset decode --tokens 1,16,32,64,128 --no-baselines
ab_libs v2 5 120 "prev" --preset decode-v2lite --tokens 4,32,64 --no-baselines
source scripts/ab-call-end.sh
