#!/bin/bash
# Session 38, device call 2 (issue 15). The tree (.ab/commit, "tip": m loaded in each half of the
# decode combine, as before session 38; the abort flag tested at its barriers) against "monce": the
# same tree with the decode combine keeping m in shared memory only when m is on the device
# (15688d7's combine.cu, built from the working tree with that file swapped in).
# Steps: general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), m on the host and on the device
# (--device-m), 6 rounds each; make test of the tree.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-380}
source scripts/ab-call-start.sh $OUT/c2
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
ab_libs general 6 60 "monce" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_libs devm 6 60 "monce" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines --device-m
EPKIT_CALL_TEST_TIMEOUT=$(lim 240) source scripts/ab-call-end.sh make-test
