#!/bin/bash
# Session 41, device call 2 (issue 15), the landed tree (no kernel change this session) on the lent
# GPU, in this order:
# - one round of stage stamps of the landed kernels with two new detail stamps on the combine's
#   token side ("c0 recv entry", "c0 unit taken"; library stland: prepare-lib with EPKIT_AB_FLAGS=
#   "-DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_DETAIL", EPKIT_AB_UNITS="kernels/dispatch kernels/combine");
# - the W = 1 run (comm-w1: decode, decode-v2lite, prefill, both layouts, with the baselines), which
#   refreshes bench/results/h200-w1-latest.json when the GPU is an H200 (session 30's was the last,
#   e42a6ff);
# - if 130 s are left, the GPU suite (W = 1, 2, 4, 8 on one GPU; call 1 ran it on the rejected tip).
# Copy to .ab/run.sh (with .ab/commit); carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
export EPKIT_CALL_BUDGET=${EPKIT_CALL_BUDGET:-570}
source scripts/ab-call-start.sh $OUT/c2
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
ab_stages stamps 40 "stland" --preset decode,decode-v2lite --tokens 1,4 --no-baselines
ab_stages stampsd 40 "stland" --preset decode,decode-v2lite --tokens 1,4 --no-baselines --device-m
PHASE_TIMEOUT=$(lim 200) TAIL=4 scripts/gpu-session.sh "$W/w1" comm-w1
echo "comm-w1 t=$(( $(date +%s) - t0 ))"
[ $(lim 200) -ge 130 ] && ab_gpu_suite 200  # last: the kernels are session 40's, whose suite passed
source scripts/ab-call-end.sh
