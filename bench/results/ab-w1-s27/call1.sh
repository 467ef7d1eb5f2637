#!/bin/bash
# Session 27, device call 1. Libraries built on the CPU machine with scripts/bench-ab.sh prepare-lib:
#   base      9c9931d's general kernels (session 26's end; its GPU suite never ran on 9155ef1)
#   e2        the tip with the sender's early slice as an L1 prefetch (-DEPKIT_AB_EARLY=2)
#   noearly   the tip without the early slice (-DEPKIT_AB_EARLY=0)
#   nodense   the tip without the dense-row guess in combine_send (-DEPKIT_AB_DENSE=0)
#   stbase / sttip (-DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK), stbase0 / sttip0 (block 0)
# tip = this build (24c6f60: early slice in registers + dense rows). GPU suite on the tip first.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
ab_gpu_suite 170
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
ab_libs gen 5 230 "base e2 noearly nodense" "${ARGS[@]}"
ab_stages gstages 60 "stbase sttip stbase0 sttip0" "${ARGS[@]}"
source scripts/ab-call-end.sh
