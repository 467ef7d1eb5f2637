#!/bin/bash
# Session 26, device call 3 (issue 15, the general kernels: tagged dispatch messages; the full W = 1
# benchmark of the session's tree). Libraries built on the CPU machine with
# scripts/bench-ab.sh prepare-lib NAME . :
#   prev     777f861 (call 2's tip, the sending blocks off the copy, only up to half the grid)
#   stprev / sttip   prev and the tip with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK
#   stprev0 / sttip0 the same with -DEPKIT_STAGE_TIMERS only (block 0's stamps)
# tip = this build (c3b5a61: decode objects' dispatch messages as tagged words, no counter or release).
# The GPU suite first (tagged messages at W = 2, 4, 8 with several PEs on the GPU), then the general
# kernels at W = 1 (EPKIT_LOCAL_KERNELS=0: a W = 1 decode object maps itself, so its messages are
# tagged too), the stamps, and the full W = 1 benchmark (the W = 1 kernels; h200-w1-latest.json).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
ab_gpu_suite 200
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
ab_libs gen 7 160 "prev" "${ARGS[@]}"
ab_libs wad 5 60 "prev" "${ARGS[@]}" --weights-at-dispatch
ab_stages gstages 70 "stprev sttip stprev0 sttip0" "${ARGS[@]}"
timeout $(lim 60) scripts/gpu-session.sh $W/s comm-w1 > $W/comm-w1.txt 2>&1; echo "comm-w1 rc=$?"
cp bench/results/h200-w1-latest.json $W/ 2>/dev/null; tail -n 30 $W/comm-w1.txt
source scripts/ab-call-end.sh
