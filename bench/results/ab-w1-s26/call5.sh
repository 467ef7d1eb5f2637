#!/bin/bash
# Session 26, device call 5: the session's end. Libraries built on the CPU machine with
# scripts/bench-ab.sh prepare-lib NAME . :
#   base     208af95 (session 25's end, this session's start)
#   stbase / sttip   base and the tip with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK
#   sttip0   the tip with -DEPKIT_STAGE_TIMERS only (block 0's stamps)
# tip = this build (the session's final kernels: call 1's waits, call 2's sending blocks off the
# copy with 777f861's half-grid rule; the tagged messages reverted). The GPU suite on this tree
# first, then the general kernels at W = 1 against the session's start, the stamps, and the full
# W = 1 benchmark (h200-w1-latest.json).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c5
ab_gpu_suite 180
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
ab_libs gen 7 150 "base" "${ARGS[@]}"
ab_libs wad 5 60 "base" "${ARGS[@]}" --weights-at-dispatch
ab_stages gstages 50 "stbase sttip sttip0" "${ARGS[@]}"
timeout $(lim 40) scripts/gpu-session.sh $W/s comm-w1 > $W/comm-w1.txt 2>&1; echo "comm-w1 rc=$?"
cp bench/results/h200-w1-latest.json $W/ 2>/dev/null; grep -E "epkit|nccl" $W/comm-w1.txt | grep -E " (1|128|4096)  1 " | head -n 12
source scripts/ab-call-end.sh
