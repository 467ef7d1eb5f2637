#!/bin/bash
# Session 26, device call 2 (issue 15, the general kernels: the sending blocks off the receive copy).
# Libraries built on the CPU machine with scripts/bench-ab.sh prepare-lib NAME . :
#   prev     32286fa (call 1's tip: waits take what their spin saw)
#   spare    ed6b924: a small call's own tokens send from the grid's last blocks (a block per own
#            token added to the grid), the copy's units on the blocks before them
#   stprev / sttip   prev and the tip with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK
#   stprev0 / sttip0 the same with -DEPKIT_STAGE_TIMERS only (block 0's stamps)
# tip = this build (e19b23e: spare + a sending block with no copy unit leaves before the data wait).
# The GPU suite first (the fused small dispatch at W = 2, 4, 8 with several PEs on the GPU), then
# the general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), each step bounded by what is left.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ab_gpu_suite 200
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
ab_libs gen 7 170 "prev spare" "${ARGS[@]}"
ab_libs wad 5 70 "prev" "${ARGS[@]}" --weights-at-dispatch
ab_stages gstages 80 "stprev sttip stprev0 sttip0" "${ARGS[@]}"
source scripts/ab-call-end.sh
