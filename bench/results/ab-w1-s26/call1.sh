#!/bin/bash
# Session 26, device call 1 (issue 15, the general kernels: waits that take what their spin saw).
# Libraries built on the CPU machine with scripts/bench-ab.sh prepare-lib NAME . :
#   base    208af95 (session 25's end)
#   tokl    the tip + session 25's free-warp token side (fb408bb) re-applied
#   stbase / sttip / sttokl   the same with -DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK
#             (units kernels/dispatch kernels/combine)
# tip = this build (6c685c3: wait_flag_slow returns the word it saw, wait_tagged takes it; the token
# side's tagged partials spun inline, all chunks per round, no reload).
# The GPU suite first (tagged partials and counts at W = 2, 4, 8 with several PEs on the GPU), then
# the general kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), each step bounded by what is left.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
ab_gpu_suite 200
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
ab_libs gen 7 170 "base tokl" "${ARGS[@]}"
ab_libs wad 5 80 "base tokl" "${ARGS[@]}" --weights-at-dispatch
ab_stages gstages 60 "stbase sttip sttokl" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
source scripts/ab-call-end.sh
