#!/bin/bash
# Session 27, device call 5: the one-token sending block without phase A (ranks and slots per warp
# from the histogram's counters, no atomics or barrier before the slices; P2P variant). Libraries
# built on the CPU machine with scripts/bench-ab.sh prepare-lib:
#   prev      the tree before it (call 4's tip: the count stores four at a time, the send half's stamps)
#   stprev / sttip (-DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK), stprev0 / sttip0 (block 0)
# tip = this build. The GPU suite on this tree first.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c5
ab_gpu_suite 170
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
ab_libs gen 9 100 "prev" "${ARGS[@]}"
ab_libs wad 5 50 "prev" "${ARGS[@]}" --weights-at-dispatch
ab_stages gstages 50 "stprev sttip stprev0 sttip0" "${ARGS[@]}"
source scripts/ab-call-end.sh
