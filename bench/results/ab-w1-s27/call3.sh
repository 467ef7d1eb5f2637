#!/bin/bash
# Session 27, device call 3: the session's final tree. Libraries built on the CPU machine with
# scripts/bench-ab.sh prepare-lib:
#   base      9c9931d's general kernels (session 26's end), as in calls 1 and 2
#   stbase / sttip (-DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK), stbase0 / sttip0 (block 0)
# tip = this build (the counts four per lane per pass; the early slice and the dense rows reverted;
# the block mappings as constexpr helpers). The GPU suite on this tree first, then the general
# kernels at W = 1 against the session's start, the stamps, and the full W = 1 benchmark
# (h200-w1-latest.json).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c3
ab_gpu_suite 180
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
ab_libs gen 9 120 "base" "${ARGS[@]}"
ab_libs wad 5 60 "base" "${ARGS[@]}" --weights-at-dispatch
ab_stages gstages 50 "stbase sttip stbase0 sttip0" "${ARGS[@]}"
timeout $(lim 40) scripts/gpu-session.sh $W/s comm-w1 > $W/comm-w1.txt 2>&1; echo "comm-w1 rc=$?"
cp bench/results/h200-w1-latest.json $W/ 2>/dev/null
source scripts/ab-call-end.sh
