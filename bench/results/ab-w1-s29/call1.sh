#!/bin/bash
# Session 29, device call 1: does code size cost the general decode kernels anything in the timed loop?
# - "compact": the tree's combine.cu built with -DEPKIT_AB_COMPACT (measurement only): the small P2P
#   combine kernel without its G = 2 copy of the partial sum, without the block-prefix path (W > 32)
#   and without the untagged token side, 6776 -> 2664 SASS instructions. Valid for the cases timed
#   here: W = 1 (<= 32), tagged decode objects; at 1 token the group is G = 4 in both libraries, so
#   the work is the same and only the code differs. "base": the same tree without the flag, built
#   on the same machine as "compact". General kernels at W = 1 (EPKIT_LOCAL_KERNELS=0), 9 rounds.
# - ncu with --replay-mode application on the tip and on "compact": each pass reruns the bench, so
#   the sampled kernels follow their real predecessors (kernel replay restores memory between passes,
#   which left session 28's sampled pass with cold instruction caches).
# Copy to .ab/run.sh; carry [".deps/wheels", ".deps/googletest", ".ab"].
set -u
source scripts/ab-call-start.sh $OUT/c1
ab_libs general 9 150 "base compact" --preset decode,decode-v2lite --tokens 1,4,128 --no-baselines
NCU=(--replay-mode application --section WarpStateStats --section SourceCounters --warp-sampling-interval 0
     --launch-skip 30 --launch-count 4)
ab_ncu app build-gpu/src 150 "${NCU[@]}" -- --preset decode --tokens 1 --no-baselines --iters 50
ab_ncu app-compact .ab/lib/compact 120 "${NCU[@]}" -- --preset decode --tokens 1 --no-baselines --iters 50
source scripts/ab-call-end.sh
