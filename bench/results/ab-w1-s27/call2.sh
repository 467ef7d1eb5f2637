#!/bin/bash
# Session 27, device call 2. Libraries built on the CPU machine with scripts/bench-ab.sh prepare-lib:
#   base      9c9931d's general kernels (session 26's end), as in call 1
#   reg       the tip with the sender's early slice in registers (-DEPKIT_AB_EARLY=1, call 1's tip)
#   noearly   the tip without the early slice (-DEPKIT_AB_EARLY=0)
#   nodense   the tip without the dense-row guess (-DEPKIT_AB_DENSE=0)
#   nocntb    the tip with the counts stored one per lane per pass (-DEPKIT_AB_CNTB=0)
#   stbase / sttip (-DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK), stbase0 / sttip0 (block 0)
# tip = this build: the early slice as an L1 prefetch, the dense row's load before the counts
# (branch-free), the counts four per lane per pass. GPU suite on the tip first.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c2
ab_gpu_suite 170
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
ab_libs gen 9 200 "base reg noearly nodense nocntb" "${ARGS[@]}"
ab_libs wad 5 60 "base" "${ARGS[@]}" --weights-at-dispatch
ab_stages gstages 60 "stbase sttip stbase0 sttip0" "${ARGS[@]}"
source scripts/ab-call-end.sh
