#!/bin/bash
# Session 31, device call 4: the lean decode send half, step by step, general kernels at W = 1
# (EPKIT_LOCAL_KERNELS=0), 7 rounds in one process per library, V3 and V2-Lite at 1, 4, 128 tokens:
# - "base": 02264f0 (the tree before the session's kernel changes);
# - "lean1": 5b85a37 (the lean send half; call 3's tip);
# - tip: b23098e (its slice loads beside the index loads).
# Then stamps at 1 token of base and tip, of the grid's last block (st*: the sending block) and of
# block 0 (st0*: a copy block); then the GPU suite on the tip.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
ab_libs general 7 200 "base lean1" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
ab_stages stages 80 "stbase sttip st0base st0tip" --preset decode,decode-v2lite --tokens 1 --no-baselines
ab_gpu_suite 200
source scripts/ab-call-end.sh
