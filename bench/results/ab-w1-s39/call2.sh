#!/bin/bash
# Session 39, device call 2 (issue 15): PREPARED, NEVER RAN. Meant to follow call 1 on the same machine. Block 0's stamps with
# the detail stamps (-DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_DETAIL) of the tree ("stbase") and of the
# tree with the idle-warp parameter touch ("sttouch", + -DEPKIT_AB_TOUCH_IDLE=1), m on the host and
# on the device (libraries built as call 1's, with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_DETAIL added).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-${C2_BUDGET:-300}}
source scripts/ab-call-start.sh $OUT/c2
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
ab_stages stages0 60 "stbase sttouch" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
ab_stages stages0d 60 "stbase sttouch" --preset decode,decode-v2lite --tokens 1,4 --no-baselines --device-m
source scripts/ab-call-end.sh
