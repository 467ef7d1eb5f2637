#!/bin/bash
# Session 27, device call 4: the send half's chain, stamped inside (ranks taken, slices stored, send
# synced), and the send half's second barrier skipped when the round loop ran
# (nosync, -DEPKIT_AB_NOSYNC2) against the tip (5 rounds). Libraries built on the CPU machine with
# scripts/bench-ab.sh prepare-lib: sttip (-DEPKIT_STAGE_TIMERS -DEPKIT_STAGE_LAST_BLOCK), sttip0
# (-DEPKIT_STAGE_TIMERS), nosync. tip = this build.
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c4
ARGS=(--preset decode,decode-v2lite --tokens 1,4,128 --no-baselines)
ab_stages gstages 50 "sttip sttip0" "${ARGS[@]}"
ab_libs gen 7 90 "nosync" "${ARGS[@]}"
source scripts/ab-call-end.sh
