#!/bin/bash
# Session 31, device call 3: dispatch's decode kernel with the lean send half (the tip) against
# "base" (02264f0's kernels, the tree before it), general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0),
# 7 rounds in one process per library, V3 and V2-Lite at 1, 4 and 128 tokens (128 does not take the
# decode kernel: the control); then the GPU suite on the tip (W = 1, 2, 4, 8 on one GPU), and one
# round of stamps of the tip.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
ab_libs general 7 200 "base" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_gpu_suite 220
source scripts/ab-call-end.sh
