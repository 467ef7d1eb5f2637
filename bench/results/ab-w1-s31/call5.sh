#!/bin/bash
# Session 31, device call 5: the decode dispatch with every parameter line touched first
# ("touch": the tip with -DEPKIT_DECODE_TOUCH=1 on dispatch.cu) against the tip (the lean send half,
# 5b85a37's kernels) and "base" (02264f0), general kernels at W = 1, 9 rounds, 1 and 4 tokens.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c5
ab_libs general 9 240 "base touch" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
source scripts/ab-call-end.sh
